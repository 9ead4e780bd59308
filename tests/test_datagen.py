"""data_gen through the real openai client and an in-process fake transport: every failure mode ends
labeled, repaired or quarantined with the right reason; the cache re-sends nothing it has."""

import json
from pathlib import Path

import pytest
from datagen_helpers import mock_client, toy_config, window_marker
from datasets import load_from_disk

from data_gen.fake_teacher import FakeTeacher
from data_gen.run import run
from dimmem.llm import FatalModelError, RateLimiter


def run_with(cfg, fake):
    return run(cfg, show_progress=False, http_client=mock_client(fake))


def quarantine(cfg):
    return [json.loads(line) for line in Path(cfg.out, "quarantine.jsonl").read_text().splitlines()]


def test_clean_run_labels_every_window(tmp_path):
    cfg = toy_config(tmp_path)
    report = run_with(cfg, FakeTeacher())
    assert report["labeled"] == report["windows"] > 3 and report["quarantined"] == 0
    assert report["requests_sent"] == report["windows"] and report["cache_hits"] == 0
    assert report["input_tokens"] > 0 and report["cost_usd"] == pytest.approx(
        (report["input_tokens"] * 1.0 + report["output_tokens"] * 2.0) / 1e6
    )
    ds = load_from_disk(str(tmp_path / "dataset"))
    rows = [r for split in ds.values() for r in split]
    assert len(rows) == report["windows"]
    row = rows[0]
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert json.loads(row["messages"][2]["content"])["memories"]
    assert (row["task"], row["prompt_version"], row["teacher_model"]) == (
        "extract",
        "extract/v1",
        "teacher-x",
    )
    conv_splits = {}
    for name, split in ds.items():
        for cid in split["conversation_id"]:
            conv_splits.setdefault(cid, set()).add(name)
    assert all(len(s) == 1 for s in conv_splits.values())  # split by conversation, never by window
    for name in ("quarantine.jsonl", "report.json", "README.md", "labels.jsonl"):
        assert (tmp_path / name).exists()


@pytest.mark.parametrize(
    "sequence,status,reason",
    [
        (["429", "ok"], "labeled", None),
        (["500", "500", "ok"], "labeled", None),
        (["timeout", "ok"], "labeled", None),
        (
            ["500"] * 4,
            "quarantined",
            "request_failed: http://fake.test/v1: gave up after 4 attempts: 500 server error",
        ),
        (["nonjson", "ok"], "repaired", None),
        (["schema", "ok"], "repaired", None),
        (["overlap", "ok"], "repaired", None),
        (["nonjson", "nonjson"], "quarantined", "invalid after 1 repair round(s): json"),
        (["overlap", "overlap"], "quarantined", "invalid after 1 repair round(s): source_turns_overlap"),
        (["schema", "nonjson"], "quarantined", "invalid after 1 repair round(s): json"),
        (["truncated", "ok"], "labeled", None),
        (["truncated"] * 3, "quarantined", "truncated: still cut off at max_tokens=2048"),
    ],
)
def test_failure_modes(tmp_path, sequence, status, reason):
    cfg = toy_config(tmp_path)
    marker = window_marker(cfg)
    fake = FakeTeacher({marker: sequence})
    report = run_with(cfg, fake)
    assert fake.seen[marker] == len(sequence)
    assert report[status] >= 1
    if status == "quarantined":
        [row] = quarantine(cfg)
        assert row["reason"].splitlines()[0] == reason and row["window_id"].endswith("/w0001")
        assert row["window_id"] not in {
            r["window_id"] for s in load_from_disk(str(tmp_path / "dataset")).values() for r in s
        }
    else:
        assert report["quarantined"] == 0 and report["labeled"] + report["repaired"] == report["windows"]
    if sequence[0] == "truncated":
        assert (
            report["truncation_retries"] == len(sequence) - 1
        )  # each retry doubles the budget up to the cap


def test_repair_round_sends_the_validator_report(tmp_path):
    cfg = toy_config(tmp_path, concurrency=1)
    marker = window_marker(cfg)
    fake = FakeTeacher({marker: ["overlap", "ok"]})
    bodies = []
    original = fake.respond
    fake.respond = lambda body, behaviour: (bodies.append(body), original(body, behaviour))[1]
    run_with(cfg, fake)
    repair = next(b for b in bodies if len(b["messages"]) == 4)
    assert repair["messages"][2]["role"] == "assistant"
    assert "memories[0].source_turns: [source_turns_overlap]" in repair["messages"][3]["content"]
    assert repair["response_format"]["json_schema"]["strict"] is True
    # the window's own schema: its two overlap turns (t1, t2) cannot be cited at all
    variants = repair["response_format"]["json_schema"]["schema"]["$defs"].values()
    citable = {turn for v in variants for turn in v["properties"]["source_turns"]["items"]["enum"]}
    assert "t3" in citable and not citable & {"t1", "t2"}


def test_rerun_sends_nothing_and_rebuilds_the_same_dataset(tmp_path):
    cfg = toy_config(tmp_path)
    first = run_with(cfg, FakeTeacher())
    before = [r for s in load_from_disk(str(tmp_path / "dataset")).values() for r in s]
    fake = FakeTeacher()
    second = run_with(cfg, fake)
    assert (
        fake.requests == 0 and second["requests_sent"] == 0 and second["cache_hits"] == first["requests_sent"]
    )
    assert [r for s in load_from_disk(str(tmp_path / "dataset")).values() for r in s] == before


def test_new_model_or_prompt_relabels(tmp_path):
    run_with(toy_config(tmp_path), FakeTeacher())
    fake = FakeTeacher()
    report = run_with(toy_config(tmp_path, model="teacher-y"), fake)
    assert fake.requests == report["windows"]
    assert load_from_disk(str(tmp_path / "dataset"))["train"][0]["teacher_model"] == "teacher-y"


def test_quarantine_is_retried_only_when_asked(tmp_path):
    cfg = toy_config(tmp_path)
    marker = window_marker(cfg)
    run_with(cfg, FakeTeacher({marker: ["nonjson"]}))
    again = FakeTeacher({marker: ["ok"]})
    report = run_with(cfg, again)
    assert again.requests == 0 and report["quarantined"] == 1
    retry = FakeTeacher({marker: ["ok"]})
    report = run_with(cfg.model_copy(update={"retry_quarantined": True}), retry)
    assert retry.requests == 1 and report["quarantined"] == 0
    assert quarantine(cfg) == []


def test_api_key_never_reaches_outputs(tmp_path, monkeypatch):
    secret = "sk-test-DO-NOT-LEAK-1234567890"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    cfg = toy_config(tmp_path)
    run_with(cfg, FakeTeacher())
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_fatal_errors_stop_the_run(tmp_path):
    class Unauthorized(FakeTeacher):
        def respond(self, body, behaviour):
            return (
                401,
                {},
                {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}},
            )

    with pytest.raises(FatalModelError, match="401"):
        run_with(toy_config(tmp_path), Unauthorized())


def test_rate_limiter_paces_requests():
    class Small(RateLimiter):
        BURST_SECONDS = 0.05  # a bucket of one request

    limiter = Small(rpm=1200, tpm=None)  # 20 requests a second
    waits = [limiter.reserve(100) for _ in range(11)]
    assert waits[0] == 0 and waits[-1] >= 0.45  # 10 refills of 50 ms; it can never be faster
    assert waits == sorted(waits)  # first come, first served


def test_rate_limiter_counts_tokens():
    limiter = RateLimiter(rpm=None, tpm=600)  # 10 tokens a second, a 100-token burst
    assert limiter.reserve(100) == 0
    assert limiter.reserve(50) == pytest.approx(5.0, abs=0.05)


def test_rate_limiter_pause_holds_everyone():
    limiter = RateLimiter(None, None)
    limiter.pause(0.3)
    assert all(limiter.reserve(1) >= 0.29 for _ in range(5))
