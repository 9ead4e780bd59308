"""A local OpenAI-compatible teacher for tests, benchmarks and dry runs: no model, scripted behaviour.

It answers chat completions with a schema-valid answer built from the prompt (extract: one memory from
the first new turn; free text without response_format: see `text_answer`), after a fixed latency, and
can be scripted to misbehave for requests whose user message contains a marker:
`{"toy-0003": ["429", "500", "ok"]}` makes the 1st such request a 429, the 2nd a 500 and every later
one succeed. Behaviours: ok, 429, 500, timeout, nonjson, schema, overlap, truncated. It also implements
the Batch API endpoints (files, batches) over the same logic.

With `max_model_len` it is a server with a small context, as vLLM is: a request whose `max_tokens`, or
prompt plus `max_tokens`, exceeds it gets vLLM's own 400 messages (prompt tokens counted as characters
/ 4, as in `usage`), and `/v1/models` reports it.

    python -m devtools.fake_teacher --port 8011 --latency 0.05 [--script faults.json] [--max-model-len N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx2
from fastapi import FastAPI, Request, UploadFile
from fastapi.responses import JSONResponse, Response

from dimmem.contract.records import memory_record
from dimmem.launch import Service, free_port

# devtools is not installed: the server process finds it in the checkout this file is in, whatever its cwd
CHECKOUT = Path(__file__).resolve().parent.parent
_NEW_TURN = re.compile(r"^(t\d+) (\S+): (.+)$", re.MULTILINE)


class FakeTeacher:
    def __init__(
        self,
        script: dict[str, list[str]] | None = None,
        latency: float = 0.0,
        timeout_sleep: float = 30.0,
        max_model_len: int | None = None,
    ):
        self.script = script or {}
        self.max_model_len = max_model_len
        self.latency, self.timeout_sleep = latency, timeout_sleep
        self.seen: dict[str, int] = defaultdict(int)
        self.requests = 0
        self.bodies: list[dict] = []  # request bodies received in process (tests read them)
        self.lock = threading.Lock()
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}

    def behaviour(self, body: dict) -> str:
        text = body["messages"][1]["content"] if len(body["messages"]) > 1 else ""
        with self.lock:
            self.requests += 1
            if self.context_error(body) is not None:  # refused before generation: the script waits
                return "context_length"
            for marker, sequence in self.script.items():
                if marker in text:
                    n = self.seen[marker]
                    self.seen[marker] += 1
                    return sequence[min(n, len(sequence) - 1)]
        return "ok"

    @staticmethod
    def prompt_tokens(body: dict) -> int:
        return sum(len(m["content"]) for m in body["messages"]) // 4

    def context_error(self, body: dict) -> str | None:
        """vLLM's 400 message when the request does not fit `max_model_len`, else None."""
        limit = self.max_model_len
        if limit is None:
            return None
        prompt, budget = self.prompt_tokens(body), body.get("max_tokens") or 16
        if budget > limit:
            return (
                f"max_tokens={budget} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens."
            )
        if prompt + budget > limit:
            return (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt + budget} tokens ({prompt} in the messages, {budget} in the completion). "
                "Please reduce the length of the messages or completion."
            )
        return None

    def respond(self, body: dict, behaviour: str) -> tuple[int, dict, dict]:
        """(status, headers, JSON body) for one chat-completions request."""
        if (message := self.context_error(body)) is not None:
            return (
                400,
                {},
                {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}},
            )
        if behaviour == "429":
            return (
                429,
                {"retry-after": "0.2"},
                {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}},
            )
        if behaviour == "500":
            return 500, {}, {"error": {"message": "The server had an error", "type": "server_error"}}
        value = self.answer(body, behaviour)
        content, finish = value if isinstance(value, str) else json.dumps(value), "stop"
        if behaviour == "nonjson":
            content = "Sure! Here are the memories I found in this conversation."
        elif behaviour == "truncated":
            content, finish = content[: len(content) // 2], "length"
        usage = {
            "prompt_tokens": self.prompt_tokens(body),
            "completion_tokens": len(content) // 4,
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return (
            200,
            {},
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "fake"),
                "usage": usage,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": finish,
                        "message": {"role": "assistant", "content": content},
                    }
                ],
            },
        )

    def answer(self, body: dict, behaviour: str) -> dict | str:
        if "response_format" not in body:
            return self.text_answer(body["messages"][-1]["content"])
        name = body.get("response_format", {}).get("json_schema", {}).get("name", "")
        prompt = body["messages"][1]["content"]
        if "parse_query" in name or prompt.startswith("Reference date:"):
            return {
                "target_types": ["episodic"],
                "time": None,
                "location": None,
                "keywords": ["question"],
                "need_assistant_context": False,
            }
        if "consolidate" in name or prompt.startswith("Stored candidate"):
            return {"action": "KEEP_BOTH", "memory": None}
        if name.startswith("dimmem_paper"):
            return self.paper_answer(body)
        new_part = prompt.split("## New turns", 1)[-1]
        turns = _NEW_TURN.findall(new_part)
        if not turns:
            return {"memories": []}
        local_id, speaker, text = turns[0]
        memory = memory_record(
            source_turns=[local_id],
            speaker=speaker,
            content=f"{speaker} said: {text}",
            type="fact",
            keywords=[speaker],
        )
        if behaviour == "schema":
            del memory["keywords"]
        elif behaviour == "overlap":
            memory["source_turns"] = ["t1"]
        return {"memories": [memory]}

    @staticmethod
    def paper_answer(body: dict) -> dict:
        """The DimMem authors' format (`dimmem.contract.paper_format`): one memory from the first message
        the window's schema lets it cite."""
        memories = body["response_format"]["json_schema"]["schema"]["properties"]["memories"]
        variants = memories.get("items", {}).get("anyOf")
        if not variants:
            return {"memories": []}
        props = variants[0]["properties"]
        n = props["source_id"]["enum"][0]
        line = body["messages"][1]["content"].splitlines()[n - 1]
        speaker, text = line.split("] ", 1)[1].split(".", 1)[1].split(": ", 1)
        memory = {"source_id": n}
        if "source_speaker" in props:
            memory["source_speaker"] = speaker
        memory["content"] = f"{speaker} said: {text}"
        memory["dimension"] = {
            "memory_type": "fact",
            **dict.fromkeys(("time", "location", "reason", "purpose"), ""),
            "keywords": [speaker],
        }
        return {"memories": [memory]}

    @staticmethod
    def text_answer(prompt: str) -> str:
        """Free-text chat (no response_format), as memory QA uses it: a judge prompt is graded CORRECT when
        every word of the gold answer is in the generated one; an answer prompt gets its first memory."""
        if gold := re.search(r"^Gold answer: (.*)$", prompt, re.MULTILINE):
            given = re.search(r"^Generated answer: (.*)$", prompt, re.MULTILINE).group(1)
            words = lambda text: set(re.findall(r"\w+", text.lower()))  # noqa: E731
            return "CORRECT" if words(gold.group(1)) <= words(given) else "WRONG"
        memories = re.findall(r"^- \[[^\]]*\] (.+)$", prompt, re.MULTILINE)
        return memories[0] if memories else "I don't know"

    async def chat(self, body: dict) -> tuple[int, dict, dict]:
        behaviour = self.behaviour(body)
        await asyncio.sleep(self.timeout_sleep if behaviour == "timeout" else self.latency)
        return self.respond(body, behaviour)

    # Batch API: a batch completes as soon as it is created
    def create_file(self, content: bytes) -> dict:
        file_id = f"file-{uuid.uuid4().hex[:12]}"
        self.files[file_id] = content
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(time.time()),
            "filename": "input.jsonl",
            "purpose": "batch",
            "status": "processed",
        }

    def create_batch(self, input_file_id: str) -> dict:
        out, errors = [], []
        for line in self.files[input_file_id].decode().splitlines():
            request = json.loads(line)
            status, _, body = self.respond(request["body"], self.behaviour(request["body"]))
            row = {
                "id": f"req-{uuid.uuid4().hex[:8]}",
                "custom_id": request["custom_id"],
                "response": {"status_code": status, "body": body},
                "error": None,
            }
            (out if status == 200 else errors).append(json.dumps(row))
        batch_id = f"batch-{uuid.uuid4().hex[:12]}"
        output = self.create_file("\n".join(out).encode())["id"] if out else None
        error = self.create_file("\n".join(errors).encode())["id"] if errors else None
        self.batches[batch_id] = {
            "id": batch_id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "errors": None,
            "input_file_id": input_file_id,
            "completion_window": "24h",
            "status": "completed",
            "output_file_id": output,
            "error_file_id": error,
            "created_at": int(time.time()),
            "request_counts": {"total": len(out) + len(errors), "completed": len(out), "failed": len(errors)},
        }
        return self.batches[batch_id]


def create_app(fake: FakeTeacher) -> FastAPI:
    app = FastAPI(title="fake OpenAI-compatible teacher")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        status, headers, body = await fake.chat(await request.json())
        return JSONResponse(body, status_code=status, headers=headers)

    @app.post("/v1/files")
    async def upload(file: UploadFile):
        return fake.create_file(await file.read())

    @app.get("/v1/files/{file_id}/content")
    async def content(file_id: str):
        return Response(fake.files[file_id], media_type="application/jsonl")

    @app.post("/v1/batches")
    async def batch(request: Request):
        return fake.create_batch((await request.json())["input_file_id"])

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(batch_id: str):
        return fake.batches[batch_id]

    @app.get("/v1/models")
    async def models():
        card = {"id": "fake", "object": "model", "owned_by": "fake-teacher"}
        if fake.max_model_len is not None:
            card["max_model_len"] = fake.max_model_len
        return {"object": "list", "data": [card]}

    @app.get("/stats")
    async def stats():
        return {"requests": fake.requests}

    return app


class FakeTeacherProcess(Service):
    """This server in its own process on a free loopback port (for tests and the benchmark), started at
    once and stopped with `stop()`."""

    def __init__(
        self,
        latency: float = 0.0,
        script_path: str | None = None,
        start_timeout: float = 30.0,
        log: str | None = None,
        max_model_len: int | None = None,
    ):
        self.port = free_port()
        command = [
            sys.executable,
            "-m",
            "devtools.fake_teacher",
            "--port",
            str(self.port),
            "--latency",
            str(latency),
        ]
        command += ["--script", str(script_path)] if script_path else []
        command += ["--max-model-len", str(max_model_len)] if max_model_len else []
        if not log:
            with tempfile.NamedTemporaryFile(prefix="fake-teacher-", suffix=".log", delete=False) as handle:
                log = handle.name
        search_path = os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))
        super().__init__(
            command,
            f"http://127.0.0.1:{self.port}/stats",
            log,
            env={"PYTHONPATH": search_path},
            startup_timeout=start_timeout,
            name="fake teacher",
        )
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.__enter__()

    @property
    def proc(self) -> subprocess.Popen:
        return self.process

    def requests(self) -> int:
        """Chat completions the server has received so far."""
        return httpx2.get(f"http://127.0.0.1:{self.port}/stats", timeout=2).json()["requests"]

    def stop(self, grace: float = 5.0) -> None:
        super().stop(grace)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds before each chat completion answers"
    )
    parser.add_argument("--script", help="JSON file mapping a prompt marker to a list of behaviours")
    parser.add_argument(
        "--max-model-len",
        type=int,
        help="a context this small: requests beyond it get vLLM's 400 (as a small-context vLLM server)",
    )
    args = parser.parse_args()
    script = None
    if args.script:
        with open(args.script) as handle:
            script = json.load(handle)
    uvicorn.run(
        create_app(FakeTeacher(script, args.latency, max_model_len=args.max_model_len)),
        host=args.host,
        port=args.port,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
