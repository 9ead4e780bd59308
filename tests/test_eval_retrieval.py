"""The LoCoMo retrieval benchmark end to end on one real conversation, and its scoring on known cases."""

import json

import pytest

from dimmem.cli import main
from eval.retrieval import RANKINGS, evidence_of, score_ranking


def test_scoring_on_known_rankings():
    sources = {"a": ["D1:1"], "b": ["D1:2", "D1:3"], "c": ["D2:1"]}
    assert score_ranking(["c", "b", "a"], sources, {"D1:3", "D1:1"}, [1, 2, 3]) == {
        "recall@1": 0.0,
        "recall@2": 0.5,
        "recall@3": 1.0,
        "mrr": 0.5,
    }
    assert score_ranking(["c"], sources, {"D9:9"}, [1])["mrr"] == 0.0
    assert evidence_of({"evidence": ["D8:6; D9:17", "D1:2"]}) == {"D8:6", "D9:17", "D1:2"}


@pytest.mark.slow
def test_retrieval_command_on_one_conversation(tmp_path, locomo_path, capsys):
    one = tmp_path / "one.json"
    one.write_text(json.dumps(json.loads(locomo_path.read_text())[:1]))
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "eval",
                "retrieval",
                "--benchmark",
                "locomo",
                "--input",
                str(one),
                "--memories",
                "turns",
                "--k",
                "5,10",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert result["questions"] > 100 and result["records"] == 419
    for name in ("bm25", "dense", "dimension", "fused"):
        assert set(result[name]) == {"recall@5", "recall@10", "mrr", "tokens@5", "tokens@10"}
        assert 0.0 <= result[name]["recall@5"] <= result[name]["recall@10"] <= 1.0
        assert 0 < result[name]["tokens@5"] < result[name]["tokens@10"]  # context tokens per question
    assert result["fused"]["recall@10"] >= max(result[p]["recall@10"] for p in ("bm25", "dense", "dimension"))
    assert (
        result["bm25"]["recall@10"] > 0.3 and result["dense"]["recall@10"] > 0.3
    )  # real retrieval, not noise
    assert set(RANKINGS) <= set(result) and "| fused |" in capsys.readouterr().out
