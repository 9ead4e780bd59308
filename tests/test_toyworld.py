"""The toy world is seeded, its truth obeys the contract, and the oracle labels every window validly."""

import json

from data_gen.config import DatagenConfig
from data_gen.run import run
from dimmem.contract.loaders import conversation_from_messages
from dimmem.contract.loaders._fields import Record
from dimmem.contract.toyworld import generate_world
from dimmem.contract.validate import TurnScope, validate


def test_same_seed_same_world_other_seed_other_world():
    a, b, c = generate_world(3, seed=7), generate_world(3, seed=7), generate_world(3, seed=8)
    assert [t.text for t in a[2].conversation.turns] == [t.text for t in b[2].conversation.turns]
    assert [t.text for t in a[2].conversation.turns] != [t.text for t in c[2].conversation.turns]


def test_truth_is_valid_and_covers_every_kind():
    world = generate_world(20, seed=0)
    kinds, superseding, pronoun_facts = set(), 0, 0
    for d in world:
        turns = d.conversation.turns
        scope = TurnScope({t.id: t.speaker for t in turns}, frozenset(t.id for t in turns))
        assert validate("extract", {"memories": [r.answer(r.source_turns) for r in d.records]}, scope).ok
        assert all(validate("parse_query", q.truth).ok for q in d.queries)
        kinds |= {r.type for r in d.records}
        superseding += sum(r.supersedes is not None for r in d.records)
        pronoun_facts += sum(len(r.source_turns) == 2 for r in d.records)
        text = " ".join(t.text for t in turns)
        assert any(
            word in text for word in ("yesterday", "last week", "last month", "two days ago", "last Friday")
        )
    assert kinds == {"fact", "episodic", "profile"} and superseding > 0 and pronoun_facts > 0


def test_relative_times_are_resolved_against_the_session_date():
    for d in generate_world(10, seed=0):
        by_id = {t.id: t for t in d.conversation.turns}
        for r in d.records:
            said = by_id[r.source_turns[0]].text
            if "yesterday" in said and r.type == "episodic":
                from datetime import date, timedelta

                session_day = date.fromisoformat(by_id[r.source_turns[0]].session_time[:10])
                assert r.time == (session_day - timedelta(days=1)).isoformat()
                return
    raise AssertionError("no 'yesterday' event in ten dialogues")


def test_oracle_run_labels_everything_through_the_pipeline(tmp_path):
    cfg = DatagenConfig.model_validate(
        {
            "source": {"format": "toy", "conversations": 8},
            "out": str(tmp_path),
            "windows": {"window": 12, "overlap": 3, "max_tokens": None},
            "teacher": {"kind": "oracle"},
        }
    )
    report = run(cfg, show_progress=False)
    assert report["quarantined"] == 0 and set(report["by_task"]) == {"extract", "parse_query", "consolidate"}
    labels = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    supersede = [
        label
        for label in labels
        if label["task"] == "consolidate" and label["value"]["action"] == "SUPERSEDE"
    ]
    assert supersede, "moving home should yield a SUPERSEDE pair"
    extracted = [m for label in labels if label["task"] == "extract" for m in label["memories"]]
    world = generate_world(8, seed=0)
    assert len(extracted) == sum(len(d.records) for d in world)  # every truth record, exactly once
    assert all(":" in turn for m in extracted for turn in m["source_turns"])  # pointers are global ids


def test_hf_messages_source(tmp_path):
    from datasets import Dataset

    rows = [
        {
            "id": "h1",
            "messages": [
                {"role": "user", "content": "I adopted a cat yesterday."},
                {"role": "assistant", "content": "Congratulations!"},
            ],
        }
    ]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "src"))
    conv = conversation_from_messages(rows[0], Record("x", 0), "d")
    assert [t.role for t in conv.turns] == ["user", "assistant"]
    from data_gen.run import load_source

    cfg = DatagenConfig.model_validate(
        {"source": {"format": "hf_messages", "input": str(tmp_path / "src")}, "out": "x"}
    )
    [loaded], world = load_source(cfg)
    assert world is None and loaded.id == "h1" and loaded.turns[0].text == "I adopted a cat yesterday."


def test_push_to_hub_sends_dataset_and_card(tmp_path, monkeypatch):
    from datasets import DatasetDict
    from huggingface_hub import DatasetCard

    from data_gen.dataset import push_to_hub

    cfg = DatagenConfig.model_validate(
        {
            "source": {"format": "toy", "conversations": 4},
            "out": str(tmp_path),
            "windows": {"window": 12, "overlap": 3, "max_tokens": None},
            "teacher": {"kind": "oracle"},
        }
    )
    run(cfg, show_progress=False)
    pushed = {}
    monkeypatch.setattr(
        DatasetDict,
        "push_to_hub",
        lambda self, repo, private: pushed.update(
            repo=repo, private=private, splits={k: len(v) for k, v in self.items()}
        ),
    )
    monkeypatch.setattr(
        DatasetCard,
        "push_to_hub",
        lambda self, repo, repo_type: pushed.update(card_repo=repo, repo_type=repo_type, card=str(self)),
    )
    push_to_hub(tmp_path, "me/dimmem-toy", private=True)
    assert pushed["repo"] == pushed["card_repo"] == "me/dimmem-toy" and pushed["private"] is True
    assert pushed["repo_type"] == "dataset" and sum(pushed["splits"].values()) > 0
    assert "# DimMem SFT dataset" in pushed["card"] and "toy-oracle" in pushed["card"]
