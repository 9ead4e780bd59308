"""Shared set-up for the datagen tests: a tiny toy world and the fake teacher behind the real openai
client."""

from __future__ import annotations

import httpx2

from data_gen.config import DatagenConfig
from data_gen.jobs import extract_jobs
from data_gen.run import load_source
from devtools.fake_teacher import FakeTeacher, FakeTeacherProcess


def toy_config(out, **teacher) -> DatagenConfig:
    return DatagenConfig.model_validate(
        {
            "source": {
                "format": "toy",
                "seed": 1,
                "conversations": 3,
                "sessions": 2,
                "stories_per_session": 2,
            },
            "out": str(out),
            "windows": {"window": 8, "overlap": 2, "max_tokens": None},
            "teacher": {
                "base_url": "http://fake.test/v1",
                "model": "teacher-x",
                "max_retries": 3,
                "backoff_base": 0.001,
                "timeout": 0.5,
                "max_tokens": 512,
                "max_tokens_cap": 2048,
                "concurrency": 4,
                **teacher,
            },
            "tasks": {"extract": True, "parse_query": False, "consolidate": False},
            "prices": {"teacher-x": {"input": 1.0, "output": 2.0}},
        }
    )


def mock_client(fake: FakeTeacher, sync: bool = False) -> httpx2.AsyncClient | httpx2.Client:
    """An HTTP client for the real openai client, over an in-process transport that answers like the fake
    server."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        import json

        body = json.loads(request.content)
        fake.bodies.append(body)
        behaviour = fake.behaviour(body)
        if behaviour == "timeout":
            raise httpx2.ReadTimeout("timed out", request=request)
        status, headers, payload = fake.respond(body, behaviour)
        return httpx2.Response(status, headers=headers, json=payload)

    return (httpx2.Client if sync else httpx2.AsyncClient)(transport=httpx2.MockTransport(handler))


def window_marker(cfg: DatagenConfig, conversation: int = 0, window: int = 1) -> str:
    """Text that appears in exactly one window's prompt: its first new turn, with its local id."""
    conversations, _ = load_source(cfg)
    jobs = [
        j
        for j in extract_jobs(conversations, cfg.windows.window, cfg.windows.overlap, None, None)
        if j.conversation_id == conversations[conversation].id
    ]
    w = jobs[window].window
    return f"{w.local_ids[len(w.context)]} {w.new[0].speaker}: {w.new[0].text}"


class FakeServer(FakeTeacherProcess):
    """The fake teacher in its own process, scripted through a file in the test's folder."""

    def __init__(self, tmp_path, latency: float = 0.0, script: dict | None = None):
        import json

        path = None
        if script:
            path = tmp_path / "script.json"
            path.write_text(json.dumps(script))
        super().__init__(latency, path)
