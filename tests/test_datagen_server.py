"""data_gen as users run it: the CLI in its own process against a local OpenAI-compatible server."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import pytest
import yaml
from datagen_helpers import FakeServer
from datasets import load_from_disk

pytestmark = pytest.mark.integration


def write_config(tmp_path, base_url, **extra):
    cfg = {
        "source": {"format": "toy", "seed": 3, "conversations": 12, "sessions": 3, "stories_per_session": 3},
        "out": str(tmp_path / "out"),
        "windows": {"window": 8, "overlap": 2, "max_tokens": None},
        "teacher": {
            "base_url": base_url,
            "model": "teacher-x",
            "concurrency": 4,
            "timeout": 1.0,
            "backoff_base": 0.01,
            "max_retries": 3,
        },
        "tasks": {"extract": True, "parse_query": True, "consolidate": True},
        "batch_poll_seconds": 0.1,
        **extra,
    }
    path = tmp_path / "datagen.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def datagen(config, *flags, **popen):
    cmd = [sys.executable, "-m", "data_gen", "--config", str(config), "--quiet", *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def rows(out):
    return [r for split in load_from_disk(str(out / "dataset")).values() for r in split]


def stored(out):
    """Responses committed to the run's store so far (0 before the store exists)."""
    if not (out / "cache.sqlite").exists():
        return 0
    with closing(sqlite3.connect(out / "cache.sqlite")) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
        except sqlite3.OperationalError:  # created, tables not yet
            return 0


@pytest.fixture
def server(tmp_path):
    srv = FakeServer(tmp_path, latency=0.05)
    yield srv
    srv.stop()


def test_sigkill_mid_run_resends_nothing_stored_and_ends_identical(tmp_path, server):
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    ref = datagen(write_config(reference_dir, server.base_url))
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err
    reference = json.loads(out)

    config = write_config(
        tmp_path,
        server.base_url,
        teacher={"base_url": server.base_url, "model": "teacher-x", "concurrency": 1, "timeout": 1.0},
    )
    victim = datagen(config)
    out_dir = tmp_path / "out"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and stored(out_dir) < 15:
            time.sleep(0.05)
    finally:  # never leave the victim running, whatever happened above
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
    kept = stored(out_dir)
    assert 15 <= kept < reference["requests_sent"]

    before = server.requests()
    resumed = datagen(config)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    report = json.loads(out)
    assert report["requests_sent"] == server.requests() - before == reference["requests_sent"] - kept
    assert rows(out_dir) == rows(reference_dir / "out")


def test_batch_mode_round_trip_with_repair(tmp_path):
    srv = FakeServer(tmp_path, script={"Conversation toy-0002 ": ["nonjson", "ok"]})
    try:
        config = write_config(tmp_path, srv.base_url)
        proc = datagen(config, "--batch")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        report = json.loads(out)
        assert report["batch"] and report["repaired"] >= 1 and report["quarantined"] == 0
        assert report["labeled"] + report["repaired"] == report["windows"] + report["other_jobs"]
        assert (
            err.count("submitted batch") == 2
        )  # first answers, then the one repair (fake memories pair with none)
        # a re-run finds every answer stored: no new batch, no request
        before = srv.requests()
        proc = datagen(config, "--batch")
        out, _ = proc.communicate(timeout=300)
        assert json.loads(out)["requests_sent"] == 0 and srv.requests() == before
    finally:
        srv.stop()


def test_real_timeouts_and_429_against_the_server(tmp_path):
    srv = FakeServer(tmp_path, script={"Conversation toy-0001 ": ["timeout", "429", "ok"]})
    try:
        proc = datagen(write_config(tmp_path, srv.base_url), "--limit", "40")
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        report = json.loads(out)
        assert report["quarantined"] == 0
    finally:
        srv.stop()


def test_unreachable_endpoint_quarantines_with_reason(tmp_path):
    config = write_config(
        tmp_path,
        "http://127.0.0.1:9/v1",
        teacher={"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 1, "backoff_base": 0.01},
    )
    proc = datagen(config, "--limit", "2")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = (tmp_path / "out" / "quarantine.jsonl").read_text().splitlines()
    assert lines and all(
        "request_failed: http://127.0.0.1:9/v1: gave up after 2 attempts: connection error"
        in json.loads(line)["reason"]
        for line in lines
    )


def test_small_context_server_clamps_and_says_what_cannot_fit(tmp_path):
    """`python -m devtools.fake_teacher --max-model-len`: vLLM's 400s over HTTP. Truncated answers are
    re-asked within the context and label; with a context smaller than the prompts, every window is
    quarantined saying it does not fit (not request_failed), and the run still finishes."""
    from devtools.fake_teacher import FakeTeacherProcess

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"Conversation toy-0001 ": ["truncated", "ok"]}))
    for context, expect in ((2048, "labeled"), (600, "too_long_for_teacher")):
        srv = FakeTeacherProcess(script_path=str(script), max_model_len=context)
        try:
            run_dir = tmp_path / str(context)
            run_dir.mkdir()
            teacher = {
                "base_url": srv.base_url,
                "model": "teacher-x",
                "max_tokens": 1024,
                "max_tokens_cap": 4096,
            }
            config = write_config(
                run_dir, srv.base_url, teacher=teacher, tasks={"parse_query": False, "consolidate": False}
            )
            proc = datagen(config, "--limit", "6")
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            report = json.loads(out)
            reasons = [json.loads(line)["reason"] for line in (run_dir / "out" / "quarantine.jsonl").open()]
            if expect == "labeled":
                assert report["quarantined"] == 0 and report["truncation_retries"] >= 1
            else:
                assert report["quarantined"] == report["windows"] == len(reasons) > 0
                assert all(
                    r.startswith("too_long_for_teacher: the prompt (") and "context of 600" in r
                    for r in reasons
                )
        finally:
            srv.stop()


def test_a_started_service_entered_again_is_still_one_process():
    """`FakeTeacherProcess` starts at construction; a `with` on it must not start a second server (the
    first would outlive the test, holding its port)."""
    from devtools.fake_teacher import FakeTeacherProcess

    server = FakeTeacherProcess()
    first = server.process
    with server as entered:
        assert entered.process is first and first.poll() is None
    assert first.poll() is not None
