"""Extraction metrics on crafted prediction/reference pairs with known answers, and the eval commands
end to end on a data_gen dataset (offline predictions, a real endpoint client, a local HF model)."""

import json
from pathlib import Path

import numpy as np
import pytest

from dimmem.contract.records import memory_record
from dimmem.contract.validate import TurnScope
from eval.metrics import MATCH_THRESHOLD, aggregate, score_window, token_f1
from eval.sources import SOURCES

SCOPE = TurnScope({"t1": "Ann", "t2": "Bob", "t3": "Ann", "t4": "Bob"}, frozenset({"t3", "t4"}))
HIKE = memory_record(
    source_turns=["t3"],
    speaker="Ann",
    content="Ann went hiking at Eagle Peak with her dog.",
    type="episodic",
    time="2023-05-06",
    location="Eagle Peak",
    purpose="to train for a marathon",
    keywords=["Ann", "hiking", "Eagle Peak"],
)
JOB = memory_record(
    source_turns=["t4"],
    speaker="Bob",
    content="Bob works as a nurse at the city hospital.",
    type="fact",
    location="city hospital",
    keywords=["Bob", "nurse"],
)
REFERENCE = json.dumps({"memories": [HIKE, JOB]})


def answer(*memories) -> str:
    return json.dumps({"memories": list(memories)})


def run(output, reference=REFERENCE, finish_reason="stop"):
    return aggregate([score_window(output, reference, SCOPE, finish_reason)])


def test_predictions_equal_to_references_score_one_everywhere():
    m = run(REFERENCE)
    numbers = {
        k: v for k, v in m.items() if isinstance(v, float) and k not in ("truncation_rate", "headline")
    }
    assert numbers and all(v == 1.0 for v in numbers.values()), {k: v for k, v in numbers.items() if v != 1.0}
    assert m["headline"] == 100.0 and m["truncation_rate"] == 0.0 and m["rule_violation_rate"] == {}
    assert m["reason_f1"] is None  # no matched pair has a reason on both sides: not applicable, not zero
    assert m["type_confusion"]["episodic"]["episodic"] == 1 and m["type_confusion"]["fact"]["fact"] == 1


def test_missing_and_extra_records_move_recall_and_precision():
    missing = run(answer(HIKE))
    assert (missing["memory_precision"], missing["memory_recall"]) == (1.0, 0.5)
    assert missing["memory_f1"] == pytest.approx(2 / 3) and missing["type_accuracy"] == 1.0
    extra = {**JOB, "content": "Bob has a red bicycle he rides on Sundays.", "keywords": ["Bob", "bicycle"]}
    over = run(answer(HIKE, JOB, extra))
    assert (over["memory_precision"], over["memory_recall"]) == (pytest.approx(2 / 3), 1.0)
    assert run(answer())["memory_f1"] == 0.0 and run(answer())["parse_rate"] == 1.0
    # Nothing to find and nothing found is a perfect answer: the window is valid and F1 is 1.0 by
    # convention. No pair exists, so field quality is not applicable (None), and a field that does not
    # apply must not cost the run: the headline is 100, not the 60 that counting n/a fields as 0 gave.
    empty = run(answer(), reference=answer())
    assert (
        empty["memory_f1"] == 1.0
        and empty["field_quality"] is None
        and empty["headline"] == pytest.approx(100.0)
    )
    # memories to find and none found (or the reverse): no pair, field quality n/a, F1 0, so only the
    # format fifth is left
    missed = run(answer())
    assert missed["field_quality"] is None and missed["headline"] == pytest.approx(20.0)
    invented = run(answer(HIKE), reference=answer())
    assert (
        invented["field_quality"] is None
        and invented["memory_f1"] == 0.0
        and invented["headline"] == pytest.approx(20.0)
    )


def test_wrong_type_and_wrong_date_are_scored_on_the_matched_pair():
    m = run(answer({**HIKE, "type": "fact"}, JOB))
    assert (
        m["memory_f1"] == 1.0 and m["type_accuracy"] == 0.5 and m["type_confusion"]["episodic"]["fact"] == 1
    )
    near = run(answer({**HIKE, "time": "2023-05"}, JOB))  # coarser, still overlapping
    assert near["time_exact"] == 0.5 and near["time_overlap"] == 1.0
    far = run(answer({**HIKE, "time": "2022-01-01"}, JOB))
    assert far["time_exact"] == 0.5 and far["time_overlap"] == 0.5


def test_swapped_fields_lose_field_scores_not_the_match():
    swapped = {
        **HIKE,
        "location": HIKE["purpose"],
        "purpose": HIKE["location"],
        "keywords": ["Eagle Peak", "dog"],
        "source_turns": ["t3", "t4"],
    }
    m = run(answer(swapped, JOB))
    assert m["memory_f1"] == 1.0
    assert m["location_f1"] == pytest.approx((0.0 + 1.0) / 2)  # the hike's location is wrong, the job's right
    assert (
        m["purpose_f1"] == 0.0
        and m["keyword_f1"] < 1.0
        and m["source_jaccard"] == pytest.approx((0.5 + 1.0) / 2)
    )
    assert m["headline"] < run(REFERENCE)["headline"]


def test_invalid_json_and_truncated_output():
    bad = run("Sure! Here are the memories: ...")
    assert bad["parse_rate"] == 0.0 and bad["schema_valid_rate"] == 0.0 and bad["memory_f1"] == 0.0
    assert bad["rule_violation_rate"] == {"json": 1.0} and bad["headline"] == 0.0
    cut = run(REFERENCE[: len(REFERENCE) // 2], finish_reason="length")
    assert cut["truncation_rate"] == 1.0 and cut["parse_rate"] == 0.0
    fenced = run("```json\n" + REFERENCE + "\n```")  # a harmless habit: still parses
    assert fenced["parse_rate"] == 1.0 and fenced["memory_f1"] == 1.0


def test_report_and_plots_show_not_applicable_fields(tmp_path):
    from eval.report import compare, plot_run, write_report

    m = run(answer())  # memories to find, none found: no pair, field quality n/a
    assert m["field_quality"] is None and m["reason_f1"] is None
    report = write_report(m, tmp_path).read_text()
    assert (
        "| field quality (n/a: no matched pair) | n/a |" in report and "| reason token F1 | n/a |" in report
    )
    plot_run(m, tmp_path)
    assert (tmp_path / "fields.png").stat().st_size and (tmp_path / "confusion.png").stat().st_size
    for name, metrics in (("a", m), ("b", run(REFERENCE))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
    table = compare(tmp_path / "a", tmp_path / "b")
    assert "| field quality (n/a: no matched pair) | n/a | 1.000 |  |" in table


def test_rule_violations_are_counted_per_rule():
    overlap = {**JOB, "source_turns": ["t2"]}  # context turn, and spoken by Bob: only the overlap rule
    no_keywords = {**HIKE}
    del no_keywords["keywords"]
    m = run(answer(no_keywords, overlap))
    assert m["schema_valid_rate"] == 0.0 and m["parse_rate"] == 1.0
    assert set(m["rule_violation_rate"]) == {"schema", "source_turns_overlap"}
    assert m["memory_f1"] == 1.0  # a schema slip in one field still lets the record be matched and scored


def test_match_threshold_is_on_content_token_f1():
    paraphrase = {**HIKE, "content": "Ann hiked Eagle Peak."}
    assert token_f1(paraphrase["content"], HIKE["content"]) < MATCH_THRESHOLD
    assert run(answer(paraphrase, JOB))["memory_recall"] == 0.5


def write_predictions(dataset, path, change=lambda answer: answer):
    from datasets import load_from_disk

    rows = [r for r in load_from_disk(str(dataset / "dataset"))["test"] if r["task"] == "extract"]
    path.write_text(
        "".join(
            json.dumps({"window_id": r["window_id"], "output": change(r["messages"][-1]["content"])}) + "\n"
            for r in rows
        )
    )
    return len(rows)


def test_dataset_against_itself_is_perfect_and_compare_shows_deltas(toy_dataset, tmp_path, capsys):
    from dimmem.cli import main

    n = write_predictions(toy_dataset, tmp_path / "self.jsonl")
    assert (
        main(
            [
                "eval",
                "extraction",
                "--references",
                f"{toy_dataset}:test",
                "--predictions",
                str(tmp_path / "self.jsonl"),
                "--out",
                str(tmp_path / "self"),
            ]
        )
        == 0
    )
    metrics = json.loads((tmp_path / "self" / "metrics.json").read_text())
    assert metrics["windows"] == n and metrics["headline"] == 100.0
    for key in ("parse_rate", "schema_valid_rate", "memory_f1", "type_accuracy", "time_exact", "keyword_f1"):
        assert metrics[key] == 1.0, key
    assert {p.name for p in (tmp_path / "self").iterdir()} >= {
        "metrics.json",
        "report.md",
        "fields.png",
        "confusion.png",
        "windows.jsonl",
        "predictions.jsonl",
    }
    write_predictions(toy_dataset, tmp_path / "half.jsonl", lambda a: a if len(a) % 2 else "not json")
    assert (
        main(
            [
                "eval",
                "extraction",
                "--references",
                str(toy_dataset),
                "--predictions",
                str(tmp_path / "half.jsonl"),
                "--out",
                str(tmp_path / "half"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["eval", "compare", str(tmp_path / "self"), str(tmp_path / "half")]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("| JSON parse rate"))
    assert row.startswith("| JSON parse rate | 1.000 | 0.") and row.rstrip(" |").split("|")[
        -1
    ].strip().startswith("-0.")


def test_endpoint_mode_caches_and_resumes(toy_dataset, tmp_path):
    from datagen_helpers import mock_client

    from devtools.fake_teacher import FakeTeacher
    from dimmem.cache import ResponseCache
    from dimmem.llm import ModelClient, ModelConfig
    from eval.extraction import evaluate, load_references, predict_endpoint

    refs = load_references(f"{toy_dataset}:test")
    fake = FakeTeacher()

    def client(concurrency: int) -> ModelClient:
        config = ModelConfig(
            base_url="http://fake.test/v1", model="extractor", max_retries=0, concurrency=concurrency
        )
        return ModelClient(
            config,
            cache=ResponseCache(tmp_path / "run" / "cache.sqlite"),
            http_client=mock_client(fake, sync=True),
        )

    first = predict_endpoint(refs[:2], client(2), max_tokens=512)
    assert fake.requests == 2 and all(p.finish_reason == "stop" for p in first.values())
    predictions = predict_endpoint(refs, client(4), max_tokens=512)  # a re-run sends only what is not stored
    assert fake.requests == len(refs) and sum(p.cached for p in predictions.values()) == 2
    metrics = evaluate(refs, predictions, tmp_path / "run", {"source": "endpoint"}, wall_seconds=1.0)
    assert (
        metrics["parse_rate"] == 1.0 and metrics["memory_recall"] < 1.0
    )  # the fake gives one memory per window
    assert metrics["generated_windows"] == len(refs) - 2 and metrics["output_tokens_per_window"] > 0


@pytest.mark.slow
def test_hf_model_mode_generates_with_the_chat_template(random_tiny_model, toy_dataset, tmp_path):
    from dimmem.cli import main

    base = random_tiny_model
    args = [
        "eval",
        "extraction",
        "--references",
        str(toy_dataset),
        "--hf-model",
        str(base),
        "--max-tokens",
        "16",
        "--limit",
        "3",
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(args) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["windows"] == 3 and metrics["parse_rate"] == 0.0  # a random model writes no JSON
    assert 0 < metrics["output_tokens_per_window"] <= 16 and metrics["generated_windows"] == 3
    assert main(args) == 0  # a re-run is answered from the cache
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["generated_windows"] == 0


@pytest.mark.integration
def test_memory_qa_end_to_end_against_a_local_server_resumes_from_its_cache(tmp_path, locomo_path, capsys):
    from datagen_helpers import FakeServer

    from dimmem.cli import main

    one = tmp_path / "one.json"
    one.write_text(json.dumps(json.loads(locomo_path.read_text())[:1]))
    srv = FakeServer(tmp_path)
    try:
        args = [
            "eval",
            "qa",
            "--benchmark",
            "locomo",
            "--input",
            str(one),
            "--answer-base-url",
            srv.base_url,
            "--answer-model",
            "answerer",
            "--judge-base-url",
            srv.base_url,
            "--judge-model",
            "judge",
            "--limit",
            "12",
            "--k",
            "5",
            "--out",
            str(tmp_path / "qa"),
        ]
        assert main(args) == 0
        assert srv.requests() == 24  # one answer and one judgment per question
        metrics = json.loads((tmp_path / "qa" / "metrics.json").read_text())
        rows = [json.loads(line) for line in (tmp_path / "qa" / "answers.jsonl").read_text().splitlines()]
        assert metrics["questions"] == len(rows) == 12 and metrics["conversations_ingested"] == 1
        assert metrics["judge_accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / 12)
        assert all(r["judgment"] in ("CORRECT", "WRONG") and len(r["hits"]) == 5 for r in rows)
        assert all(r["answer"] != "I don't know" for r in rows)  # the answer model saw retrieved memories
        assert set(metrics["by_category"]) <= {"1", "2", "3", "4"} and metrics["context_words_per_query"] > 0
        assert "| all | 12 |" in capsys.readouterr().out
        assert main(args) == 0  # re-run: store and cache answer everything
        assert (
            srv.requests() == 24
            and json.loads((tmp_path / "qa" / "metrics.json").read_text())["conversations_ingested"] == 0
        )
        fixture = Path(__file__).parent / "fixtures" / "longmemeval_mini.json"
        assert (
            main(
                [
                    "eval",
                    "qa",
                    "--benchmark",
                    "longmemeval",
                    "--input",
                    str(fixture),
                    "--answer-base-url",
                    srv.base_url,
                    "--answer-model",
                    "answerer",
                    "--judge-base-url",
                    srv.base_url,
                    "--judge-model",
                    "judge",
                    "--out",
                    str(tmp_path / "lme"),
                ]
            )
            == 0
        )
        lme = json.loads((tmp_path / "lme" / "metrics.json").read_text())
        assert lme["questions"] == 2 and set(lme["by_category"]) == {
            "single-session-user",
            "single-session-assistant",
        }
    finally:
        srv.stop()


def test_longmemeval_questions_are_judged_by_their_type():
    from dimmem.contract.conversation import Conversation, Turn
    from eval.qa import bleu1, prompts, questions

    turn = Turn("s1:1", "user", "user", "hi", "s1", "2023-05-20T02:21")
    meta = {
        "question_type": "temporal-reasoning",
        "question": "How many days?",
        "answer": "3",
        "question_time": "2023-06-01",
    }
    assert questions(Conversation("q1", [turn], meta), "longmemeval", set()) == [
        {
            "id": "q1",
            "question": "How many days?",
            "gold": "3",
            "category": "temporal-reasoning",
            "reference": "2023-06-01",
        }
    ]
    assert (
        questions(Conversation("q2_abs", [turn], meta), "longmemeval", set())[0]["category"] == "abstention"
    )
    criterion = prompts()["criteria"]["temporal-reasoning"]
    user = prompts()["judge"].render(question="q", gold="3", answer="4", criterion=criterion)[1]["content"]
    assert user.startswith("Extra criterion: For counts of days") and "Gold answer: 3" in user
    assert (
        prompts()["judge"]
        .render(question="q", gold="3", answer="4", criterion="")[1]["content"]
        .startswith("Question: q")
    )
    assert bleu1("the cat sat", "the cat sat") == 1.0 and bleu1("cat", "the cat sat") == pytest.approx(
        float(np.exp(1 - 2 / 1))
    )  # "the" is normalised away


@pytest.mark.integration
def test_memory_qa_reasks_a_judge_without_verdict_and_counts_its_failures(tmp_path, locomo_path, capsys):
    """A judge reply with no verdict is asked once more, then counted as a failure (never silently
    WRONG); the full-context baseline answers from the whole conversation; runs repeat with mean ± std."""
    from datagen_helpers import FakeServer

    from dimmem.cli import main

    one = tmp_path / "one.json"
    one.write_text(json.dumps(json.loads(locomo_path.read_text())[:1]))
    script = {  # per question: the answer, the judgment, the judgment asked again
        "Question: When did Melanie paint a sunrise?": ["ok", "nonjson", "ok"],
        "Question: What did Caroline research?": ["ok", "nonjson", "nonjson"],
    }
    srv = FakeServer(tmp_path, script=script)
    try:
        common = ["eval", "qa", "--benchmark", "locomo", "--input", str(one), "--limit", "4"]
        for role in ("answer", "judge"):
            common += [f"--{role}-base-url", srv.base_url, f"--{role}-model", role]
        assert main([*common, "--k", "5", "--out", str(tmp_path / "qa")]) == 0
        assert srv.requests() == 4 + 4 + 2  # answers, judgments, two asked again
        metrics = json.loads((tmp_path / "qa" / "metrics.json").read_text())
        rows = {r["question"]: r for r in map(json.loads, (tmp_path / "qa" / "answers.jsonl").open())}
        recovered, failed = rows["When did Melanie paint a sunrise?"], rows["What did Caroline research?"]
        assert len(recovered["judge_replies"]) == 2 and recovered["judgment"] in ("CORRECT", "WRONG")
        assert not recovered["judge_failed"]
        assert failed["judge_failed"] and not failed["correct"] and failed["judgment"].startswith("Sure!")
        assert metrics["judge_failures"] == 1 and metrics["judge_failure_rate"] == 0.25
        assert metrics["judge_max_tokens"] == 256 and metrics["mode"] == "memory"
        assert (
            metrics["prompts"]["file"] == "eval/prompts/qa.v1.yaml"
            and len(metrics["prompts"]["sha256"]) == 64
        )
        memory_tokens = metrics["answer_prompt_tokens_per_query"]
        assert memory_tokens > 0 and "judge failures 1 (25.0%" in capsys.readouterr().out

        out = tmp_path / "full"
        assert main([*common, "--full-context", "--runs", "2", "--out", str(out)]) == 0
        full = json.loads((out / "metrics.json").read_text())
        answers = [json.loads(line) for line in (out / "answers.jsonl").open()]
        assert full["mode"] == "full-context" and full["conversations_ingested"] == 0 and full["k"] is None
        assert full["runs"] == 2 and len(full["judge_accuracy_per_run"]) == 2 and full["questions"] == 8
        assert {r["run"] for r in answers} == {0, 1} and all(r["hits"] == [] for r in answers)
        # the whole conversation (419 turns) costs far more prompt than 5 retrieved memories
        assert full["answer_prompt_tokens_per_query"] > 10 * memory_tokens
        assert full["judge_failure_rate"] == full["judge_failures"] / 8 > 0
    finally:
        srv.stop()


@pytest.mark.parametrize("row", SOURCES, ids=lambda row: row.key)
def test_each_answer_source_is_one_flag_that_selects_it_alone(row):
    """Every row of the answer-source table is offered by `dimmem eval extraction` as its flag, and the
    flag's value lands where the config finds that source, and that one only: a source cannot be half
    added. Its `label` is what the run records as its model."""
    import argparse

    from eval.cli import add_arguments, load_run
    from eval.sources import given

    value = row.choices[0] if row.choices else "somewhere"
    argv = ["extraction", "--out", "o", row.flag, value]
    argv += ["--benchmark", "locomo"] if row.locomo_only else ["--references", "runs/x"]
    argv += ["--model", "served-name"] if row.key == "model" else []
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = load_run(parser.parse_args(argv))
    assert given(cfg) == [row]
    assert row.label(cfg) == ("served-name" if row.key == "model" else value)
