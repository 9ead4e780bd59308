"""data_gen through the real openai client and an in-process fake transport: every failure mode ends
labeled, repaired or quarantined with the right reason; the cache re-sends nothing it has."""

import json
from pathlib import Path

import pytest
from datagen_helpers import mock_client, toy_config, window_marker
from datasets import load_from_disk

from data_gen.jobs_index import COLUMNS, INDEX, JOBS, KEY
from data_gen.run import run
from devtools.fake_teacher import FakeTeacher
from dimmem.jsonl_index import write_jsonl
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
    for name in ("quarantine.jsonl", "report.json", "README.md", "labels.jsonl", JOBS, INDEX):
        assert (tmp_path / name).exists()
    assert not list(tmp_path.glob("*.partial"))


def test_a_killed_jobs_write_leaves_no_index_that_looks_complete(tmp_path):
    (tmp_path / INDEX).write_text("the previous run's index")

    def rows():
        yield {"id": "a", "task": "extract", "value": None}
        raise KeyboardInterrupt  # killed while writing

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(tmp_path / JOBS, rows(), COLUMNS, KEY, tmp_path / INDEX)
    assert not list(tmp_path.glob(f"{INDEX}*"))  # neither the old index nor a partial one


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


# ---- a teacher with a smaller context ------------------------------------------------


def _budgets(fake: FakeTeacher, marker: str) -> list[int]:
    return [b["max_tokens"] for b in fake.bodies if marker in b["messages"][1]["content"]]


def test_truncated_answers_are_re_asked_within_the_teachers_context(tmp_path):
    """vLLM with max_model_len=2048: an answer cut off at 1024 is re-asked with what the context leaves
    (2048 minus the prompt), not refused at 2048/4096 and quarantined as request_failed; once the
    endpoint has said its context, later windows are re-asked within it without a refused request."""
    cfg = toy_config(tmp_path, max_tokens=1024, max_tokens_cap=4096, concurrency=1)
    first, second = window_marker(cfg, 0, 1), window_marker(cfg, 1, 1)
    fake = FakeTeacher({first: ["truncated", "ok"], second: ["truncated", "ok"]}, max_model_len=2048)
    report = run_with(cfg, fake)
    assert report["quarantined"] == 0 and report["labeled"] == report["windows"]
    prompt = next(FakeTeacher.prompt_tokens(b) for b in fake.bodies if first in b["messages"][1]["content"])
    assert _budgets(fake, first) == [1024, 2048, 2048 - prompt]  # the 2048 one was refused (400)
    prompt = next(FakeTeacher.prompt_tokens(b) for b in fake.bodies if second in b["messages"][1]["content"])
    assert _budgets(fake, second) == [1024, 2048 - prompt]
    labels = [json.loads(line) for line in Path(cfg.out, "labels.jsonl").read_text().splitlines()]
    assert len(labels) == report["windows"]


def test_answer_still_cut_off_at_the_context_limit_is_quarantined_as_truncated(tmp_path):
    cfg = toy_config(tmp_path, max_tokens=1024, max_tokens_cap=4096)
    marker = window_marker(cfg)
    fake = FakeTeacher({marker: ["truncated"]}, max_model_len=2048)
    run_with(cfg, fake)
    [row] = quarantine(cfg)
    prompt = next(FakeTeacher.prompt_tokens(b) for b in fake.bodies if marker in b["messages"][1]["content"])
    assert row["reason"] == (
        f"truncated: still cut off at max_tokens={2048 - prompt} (all the teacher's context leaves)"
    )
    assert 4096 not in _budgets(fake, marker)  # never asked again beyond the context (no loop either)


def test_window_that_cannot_fit_the_teachers_context_says_so(tmp_path):
    cfg = toy_config(tmp_path)
    fake = FakeTeacher(max_model_len=600)  # every toy prompt is longer than 600 tokens
    report = run_with(cfg, fake)
    assert report["quarantined"] == report["windows"] > 0 and report["requests_sent"] == 0
    for row in quarantine(cfg):
        reason = row["reason"]
        assert reason.startswith("too_long_for_teacher: the prompt (") and "request_failed" not in reason
        assert (
            "tokens) does not fit the context of 600 tokens of 'teacher-x' at http://fake.test/v1" in reason
        )
    assert len(fake.bodies) <= 2 * report["windows"]  # asked at most twice each, never in a loop


def test_client_clamps_a_budget_beyond_max_model_len(tmp_path):
    """Both vLLM messages: `max_tokens=4096 cannot be greater than max_model_len=2048` (no prompt size:
    asked again just under the context), then the prompt overflow that names the prompt's tokens."""
    from dimmem.llm import ModelClient, ModelConfig

    fake = FakeTeacher(max_model_len=2048)
    client = ModelClient(
        ModelConfig(base_url="http://fake.test/v1", model="m", max_tokens=4096, max_tokens_cap=4096),
        http_client=mock_client(fake, sync=True),
    )
    messages = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "y" * 400}]
    completion = client.complete(None, messages)
    assert completion.finish_reason == "stop" and completion.max_tokens == 2048 - 200
    assert [b["max_tokens"] for b in fake.bodies] == [4096, 2047, 1848]
    assert client.context_limit == 2048 and client.usage.context_clamps == 2
