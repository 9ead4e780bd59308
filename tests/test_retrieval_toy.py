"""The toy-world retrieval benchmark: its questions mean what their evidence says, its scoring on known
cases, and the whole benchmark through `dimmem eval retrieval --benchmark toy` (memory sets, an HF
extractor, the DimMem claim on a small world)."""

import json

import pytest

from dimmem.contract.timespan import overlaps, parse_span
from dimmem.contract.toyworld import generate_world
from dimmem.runtime.query import parse_query_rules
from eval.retrieval_toy import OracleConsolidator, score_facts
from eval.toy_truth import CLASSES, Question, dialogue_questions, truth_records

WORLD = generate_world(6, seed=1000, sessions=8, stories_per_session=5)


def questions():
    return [q for d in WORLD for q in dialogue_questions(d, 1000, per_class=4)]


def test_questions_are_seeded_and_cover_every_class():
    assert questions() == questions()
    kinds = {q.kind for q in questions()}
    assert kinds == set(CLASSES)
    assert len({q.id for q in questions()}) == len(questions())
    assert all(q.facts and all(q.facts) for q in questions())


def test_each_question_parses_to_the_dimensions_of_its_evidence():
    truth = {(d.conversation.id, r.source_turns[-1]): r for d in WORLD for r in d.records}
    relative = 0
    for q in questions():
        parsed = parse_query_rules(q.question, q.reference_date)
        records = {truth[q.conversation_id, t].id: truth[q.conversation_id, t] for t in q.evidence}.values()
        assert all(r.speaker in q.question for r in records)
        if q.kind == "time":  # the parsed time (absolute or relative to the asking day) is the records'
            relative += any(w in q.question for w in ("yesterday", "last week", "last month"))
            assert parsed["time"] and all(
                overlaps(parse_span(parsed["time"]), parse_span(r.time)) for r in records
            ), q
        elif q.kind == "location":
            assert parsed["location"] and all(r.location == parsed["location"] for r in records), q
        elif q.kind == "update":  # the current home is the evidence; the homes it replaced are stale
            assert q.current in q.evidence and q.stale and not q.stale & q.evidence
        else:
            assert parsed["time"] is None and parsed["location"] is None, q
    assert relative >= 3  # relative dates are asked too


def test_fact_recall_counts_a_fact_once_and_any_of_its_statements():
    q = Question("q", "c", "profile", "?", "2023-01-01", (frozenset({"D1:1", "D3:1"}), frozenset({"D2:2"})))
    sources = {"a": ["D3:1"], "b": ["D2:2"], "c": ["D9:9"]}
    assert score_facts(["c", "a", "b"], sources, q, [1, 2, 3]) == {
        "recall@1": 0.0,
        "recall@2": 0.5,
        "recall@3": 1.0,
        "mrr": 0.5,
    }


def test_content_only_records_keep_the_content_and_lose_every_dimension():
    full, bare = truth_records(WORLD[0]), truth_records(WORLD[0], content_only=True)
    assert [r["content"] for r in full] == [r["content"] for r in bare]
    assert {r["type"] for r in bare} == {"fact"} and all(r["keywords"] == [r["speaker"]] for r in bare)
    assert not any(r[k] for r in bare for k in ("time", "location", "reason", "purpose"))
    assert any(r["time"] for r in full) and {r["type"] for r in full} == {"fact", "episodic", "profile"}


def test_oracle_consolidation_supersedes_exactly_the_moves():
    dialogue = next(d for d in WORLD if any(r.supersedes for r in d.records))
    by_id = {r["id"]: r for r in truth_records(dialogue)}
    decide = OracleConsolidator(WORLD)
    move = next(r for r in dialogue.records if r.supersedes)
    assert decide(by_id[move.id], by_id[move.supersedes], 0.9)["action"] == "SUPERSEDE"
    other = next(r for r in dialogue.records if r.id not in (move.id, move.supersedes))
    assert decide(by_id[move.id], by_id[other.id], 0.9) == {"action": "KEEP_BOTH", "memory": None}


@pytest.mark.slow
def test_toy_benchmark_shows_what_records_and_their_dimensions_buy(tmp_path, capsys):
    """The claim on a small world: records beat raw turns at fewer tokens, dimensions win the time
    questions, consolidation answers with the current home, fusion is never below its best path."""
    from dimmem.cli import main

    out = tmp_path / "toy.json"
    world = ["--set", "toy.conversations=6", "--set", "toy.questions_per_class=3"]
    assert main(["eval", "retrieval", "--benchmark", "toy", *world, "--k", "5,10", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    sets = result["sets"]
    assert set(sets) == {
        "turns",
        "records",
        "records_content_only",
        "records+consolidation",
        "records+oracle_consolidation",
    }

    def recall(name, group="all", ranking="fused"):
        return sets[name]["rankings"][ranking][group]["recall@10"]

    assert recall("records") >= recall("turns") + 0.15
    assert recall("records", "time") > recall("records_content_only", "time") + 0.2
    assert sets["records+consolidation"]["rankings"]["fused"]["update"]["current_fact"] >= 0.9
    for name in sets:
        assert recall(name) >= max(recall(name, ranking=p) for p in ("bm25", "dense", "dimension"))
    turns_tokens = sets["turns"]["context_tokens_curve"]["all"][9]
    assert sets["records"]["context_tokens_curve"]["all"][2] < turns_tokens  # k=3 beats turns' R@10
    assert sets["records"]["fused_recall_curve"]["all"][2] >= recall("turns")
    printed = capsys.readouterr().out
    assert "| records+consolidation |" in printed and "context tokens per question to reach" in printed
    assert out.with_suffix(".png").stat().st_size > 10_000  # recall against context tokens, per set
    recall = result["assistant_recall"]  # triggered about as often as needed, and the reply is there
    assert recall["trigger_rate"] <= 1.5 * recall["needing_share"] and recall["needing_assistant"] > 10
    assert recall["recall_when_needed"]["dynamic"] >= 0.9 and recall["recall_when_needed"]["never"] == 0.0
    spent = recall["context_tokens_per_question"]
    assert spent["never"] < spent["dynamic"] < spent["always"]


@pytest.mark.slow
def test_toy_benchmark_extracts_with_a_local_model_and_caches_its_answers(tmp_path, random_tiny_model):
    """A random tiny Qwen3 as the extractor: every window is generated (and fails to parse: the model
    writes no JSON), its memory sets are empty but scored, and a re-run generates nothing."""
    from dimmem.cli import main

    base = random_tiny_model
    out = tmp_path / "toy.json"
    args = ["eval", "retrieval", "--benchmark", "toy", "--extractor", f"random={base}", "--out", str(out)]
    args += ["--set", "toy.conversations=2", "--set", "toy.sessions=2", "--set", "toy.max_new_tokens=8"]
    args += ["--set", "toy.sets=[records]"]
    assert main(args) == 0
    result = json.loads(out.read_text())
    counts = result["extraction"]["random"]
    assert counts["windows"] > 0 and counts["failed_windows"] == counts["windows"] == counts["generated"]
    assert result["sets"]["random"]["records"] == 0 == result["sets"]["random+consolidation"]["records"]
    assert result["sets"]["random"]["rankings"]["fused"]["all"]["recall@10"] == 0.0
    assert result["sets"]["records"]["rankings"]["fused"]["all"]["recall@10"] > 0.5
    assert main(args) == 0  # answered from OUT's cache
    again = json.loads(out.read_text())["extraction"]["random"]
    assert again["generated"] == 0 and again["windows"] == counts["windows"]


def test_assistant_chats_point_at_the_user_turn_and_ask_for_the_reply():
    from dimmem.contract.toyworld import generate_assistant_chat

    chat = generate_assistant_chat(0, seed=1000)
    turns = {t.id: t for t in chat.conversation.turns}
    order = [t.id for t in chat.conversation.turns]
    assert {t.role for t in turns.values()} == {"user", "assistant"}
    assert all(turns[t].role == "user" for r in chat.records for t in r.source_turns)
    for question, reply, asked in chat.questions:
        parsed = parse_query_rules(question, "2024-01-01")
        assert parsed["need_assistant_context"] == (reply is not None), question
        if reply is not None:  # the reply follows the request it answers
            assert turns[reply].role == "assistant" and order.index(reply) == order.index(asked) + 1
    assert any(r.type == "episodic" for r in chat.records)  # the user's own news is there too


def test_checkpoint_table_and_plot_read_back_what_the_bench_wrote(tmp_path):
    from eval.checkpoints import main

    for step, f1, recall in ((60, 0.0, 0.0), (120, 0.1, 0.2)):
        (tmp_path / f"eval-{step}").mkdir()
        (tmp_path / f"eval-{step}" / "metrics.json").write_text(
            json.dumps({"parse_rate": 1.0, "memory_f1": f1, "headline": 100 * f1})
        )
        fused = {"all": {"recall@10": recall}, "update": {"current_fact": recall / 2}}
        sets = {
            name: {"records": 7, "rankings": {"fused": fused}}
            for name in (f"step{step}", f"step{step}+consolidation")
        }
        (tmp_path / f"retrieval-{step}.json").write_text(json.dumps({"sets": sets}))
    assert main([str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "checkpoints.json").read_text())
    assert (
        [r["step"] for r in rows] == [60, 120]
        and rows[1]["recall@10"] == 0.2
        and rows[1]["current_fact"] == 0.1
    )
    assert (tmp_path / "checkpoints.png").stat().st_size > 10_000
    (tmp_path / "retrieval-120.json").unlink()
    with pytest.raises(FileNotFoundError, match="no retrieval run for checkpoint 120"):
        main([str(tmp_path)])
    assert main([str(tmp_path), "--extraction-only"]) == 0  # a curve of the extraction columns alone
    rows = json.loads((tmp_path / "checkpoints.json").read_text())
    assert rows[0]["recall@10"] == 0.0 and rows[1]["recall@10"] is None and rows[1]["memory_f1"] == 0.1
