"""The DimMem authors' retrieval rule (`retrieval.fusion: dedup`) and update filter (`update.candidates:
paper`) as named baselines: dedup's order, cut and duplicates, and the paper filter's type, keyword
Jaccard, cosine and session-time steps; the runtime ones on both store backends."""

import zlib

import numpy as np
import pytest

from devtools.hashing_embedder import HashingEmbedder
from dimmem.config import ConfigError
from dimmem.contract.records import MEMORY_FIELDS, memory_record
from dimmem.runtime.config import MemoryConfig
from dimmem.runtime.embed import WIDTH
from dimmem.runtime.memory import Memory
from dimmem.runtime.query import parse_query_rules
from dimmem.runtime.retrieval import dedup, fuse, normalized_content


class SameVector:
    """Every text the same unit vector: cosine 1, so only the filter's other steps decide."""

    def encode(self, texts):
        out = np.zeros((len(texts), WIDTH), dtype=np.float32)
        out[:, 0] = 1.0
        return out


class TextVector:
    """Each distinct text its own one-hot vector: cosine 0 between different texts."""

    def encode(self, texts):
        out = np.zeros((len(texts), WIDTH), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row, zlib.crc32(text.encode()) % WIDTH] = 1.0
        return out


def rec(id, content, keywords, **fields):
    base = memory_record(
        source_turns=["D1:1"], speaker="Bob", content=content, type="fact", keywords=keywords
    )
    return {"id": id, **base, **fields}


# --- dedup: the authors' fusion ----------------------------------------------------------------------------
PATHS = {  # given in another order than the authors': dedup's order is its own
    "dense": [("d1", 0.9), ("b1", 0.8), ("d2", 0.7)],
    "bm25": [("b1", 0.5), ("b2", 0.4), ("b3", 0.3)],
    "dimension": [("m1", 1.0), ("b2", 0.9), ("m2", 0.8)],
}


def test_dedup_is_lexical_top_k_then_dimension_then_dense_each_record_once():
    fused = dedup(PATHS, None, k=2)
    # bm25's top 2, the dimension path's (b2 again: dropped), dense's (b1 again: dropped); rank 3 cut
    assert [rid for rid, _, _ in fused] == ["b1", "b2", "m1", "d1"]
    assert [score for _, score, _ in fused] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4])
    # every path's own rank and score kept, as the other fusions keep them
    assert fused[0][2] == {"bm25": {"rank": 1, "score": 0.5}, "dense": {"rank": 2, "score": 0.8}}
    assert fused[1][2] == {"bm25": {"rank": 2, "score": 0.4}, "dimension": {"rank": 2, "score": 0.9}}
    assert [rid for rid, _, _ in dedup(PATHS, None, 15)] == ["b1", "b2", "b3", "m1", "m2", "d1", "d2"]
    assert [rid for rid, _, _ in dedup(PATHS, None, k=1)] == ["b1", "m1", "d1"]
    # a path weighted 0 (or not named) is left out
    assert [rid for rid, _, _ in dedup(PATHS, {"bm25": 1.0, "dense": 1.0}, k=2)] == ["b1", "b2", "d1"]
    assert dedup({"bm25": [], "dimension": [], "dense": []}, None, 15) == []


def test_normalized_content_ignores_case_punctuation_and_spacing():
    assert normalized_content("Bob loves  jazz!") == normalized_content("bob loves jazz.") == "bob loves jazz"
    assert normalized_content("Bob loves jazz.") != normalized_content("Bob loves jazz piano.")


def test_fuse_dedup_drops_duplicate_contents_and_respects_k(memory_factory):
    memory = memory_factory(embedder=SameVector())
    memory.add_records(
        [
            rec("a", "Bob loves jazz.", ["Bob", "jazz"]),
            rec("a-again", "bob loves  JAZZ!", ["Bob", "music"]),  # the same content, another id
            rec("b", "Bob plays the piano.", ["Bob", "piano"]),
            rec("c", "Bob lives in Lisbon.", ["Bob", "Lisbon"]),
        ],
        user_id="bob",
        consolidate=False,
    )
    paths = {
        "bm25": [("a", 0.9), ("a-again", 0.8), ("gone", 0.7)],  # "gone": removed since: skipped
        "dimension": [("c", 1.0), ("a", 0.5)],
        "dense": [("a-again", 0.9), ("b", 0.8)],
    }
    hits = fuse(memory.store, "bob", paths, {}, k=10, fusion="dedup", dedup_k=3)
    assert [h.record["id"] for h in hits] == ["a", "c", "b"]  # a-again: a's content, dropped
    assert hits[0].paths["dimension"] == {"rank": 2, "score": 0.5}
    assert [h.record["id"] for h in fuse(memory.store, "bob", paths, {}, k=2, fusion="dedup", dedup_k=3)] == [
        "a",
        "c",
    ]
    with pytest.raises(ValueError, match="dedup_k"):
        fuse(memory.store, "bob", paths, {}, k=2, fusion="dedup")
    # the other fusions keep both records of one content: dedup alone drops them
    assert {"a", "a-again"} <= {h.record["id"] for h in fuse(memory.store, "bob", paths, {}, k=10)}


def test_search_with_fusion_dedup_follows_the_authors_order(memory_factory):
    memory = memory_factory({"retrieval": {"fusion": "dedup", "dedup_k": 1}}, embedder=HashingEmbedder())
    memory.add_records(
        [
            rec("jazz", "Bob loves jazz and plays it on Fridays.", ["Bob", "jazz"], type="profile"),
            rec("hike", "Bob went hiking at the harbor.", ["Bob", "hiking"], type="episodic"),
            rec("tea", "Bob drinks green tea every morning.", ["Bob", "tea"], type="profile"),
            rec("move", "Bob moved to Lisbon for work.", ["Bob", "Lisbon"], type="episodic"),
        ],
        user_id="bob",
        consolidate=False,
    )
    question = "What music does Bob love?"
    parsed = parse_query_rules(question, "2023-09-01")
    paths = memory.paths(question, "bob", parsed)
    assert all(paths[name] for name in ("bm25", "dimension", "dense"))
    expected = list(dict.fromkeys(paths[name][0][0] for name in ("bm25", "dimension", "dense")))
    hits = memory.search(question, user_id="bob", parsed=parsed, k=10).hits
    assert [h.record["id"] for h in hits] == expected  # each path's top 1, in order, once each


def test_config_refuses_an_unknown_fusion_or_filter():
    assert MemoryConfig().retrieval.fusion == "score" and MemoryConfig().retrieval.dedup_k == 15
    assert MemoryConfig().update.candidates == "dimmem"  # the default filter is unchanged
    for bad in (
        {"retrieval": {"fusion": "concat"}},
        {"retrieval": {"dedup_k": 0}},
        {"update": {"candidates": "mem0"}},
    ):
        with pytest.raises(ConfigError, match="fusion|dedup_k|candidates"):
            Memory({**bad, "store": ":memory:"}, embedder=SameVector())


# --- the paper's update filter -------------------------------------------------------------------------
JAZZ = rec("jazz", "Bob plays jazz piano in Lisbon.", ["Bob", "jazz", "piano", "Lisbon"])
# keyword Jaccard with JAZZ: {Bob, jazz} shared of 6 (0.33), of 7 (0.29)
GUITAR = rec("guitar", "Bob plays jazz guitar in Porto.", ["Bob", "jazz", "guitar", "Porto"])
BANDS = rec("bands", "Bob plays jazz guitar in Porto bands.", ["Bob", "jazz", "guitar", "Porto", "bands"])


def supersede(new: dict, candidate: dict, similarity: float) -> dict:
    """Every candidate a filter hands over superseded: what is tested here is which one it hands over."""
    return {"action": "SUPERSEDE", "memory": {k: new[k] for k in MEMORY_FIELDS}}


def added(memory, *records) -> list[str]:
    return [e["action"] for r in records for e in memory.add_records([r], user_id="bob")]


def paper(**thresholds) -> dict:
    return {"update": {"candidates": "paper", **thresholds}}


def test_paper_filter_refuses_a_candidate_under_the_keyword_jaccard(memory_factory):
    memory = memory_factory(paper(), store="paper", embedder=SameVector(), consolidator=supersede)
    assert added(memory, JAZZ, BANDS) == ["KEEP_BOTH", "KEEP_BOTH"]  # 0.29: no candidate
    assert memory.stats["embedding_comparisons"] == 0  # refused before any embedding comparison
    assert memory.get("jazz", user_id="bob")["status"] == "active"
    memory = memory_factory(paper(), store="paper-2", embedder=SameVector(), consolidator=supersede)
    assert added(memory, JAZZ, GUITAR) == ["KEEP_BOTH", "SUPERSEDE"]  # 0.33: a candidate
    assert memory.get("jazz", user_id="bob")["status"] == "superseded"
    stricter = memory_factory(
        paper(paper_jaccard=0.4), store="paper-3", embedder=SameVector(), consolidator=supersede
    )
    assert added(stricter, JAZZ, GUITAR) == ["KEEP_BOTH", "KEEP_BOTH"]
    # this runtime's filter takes BANDS (it shares "jazz" besides the speaker's name)
    ours = memory_factory(store="dimmem", embedder=SameVector(), consolidator=supersede)
    assert added(ours, JAZZ, BANDS) == ["KEEP_BOTH", "SUPERSEDE"]


def test_paper_filter_refuses_another_type_and_a_distant_text(memory_factory):
    memory = memory_factory(paper(), store="type", embedder=SameVector(), consolidator=supersede)
    profile = {**GUITAR, "id": "guitar-profile", "type": "profile"}
    assert added(memory, JAZZ, profile) == ["KEEP_BOTH", "KEEP_BOTH"]
    assert memory.get("jazz", user_id="bob")["status"] == "active"
    far = memory_factory(
        paper(), store="cosine", embedder=TextVector(), consolidator=supersede
    )  # cosine 0 < 0.7
    assert added(far, JAZZ, GUITAR) == ["KEEP_BOTH", "KEEP_BOTH"]
    assert far.stats["embedding_comparisons"] == 1  # a candidate, compared, under the threshold
    loose = memory_factory(
        paper(paper_similarity=-1.0), store="loose", embedder=TextVector(), consolidator=supersede
    )
    assert added(loose, JAZZ, GUITAR) == ["KEEP_BOTH", "SUPERSEDE"]


def test_paper_filter_asks_no_speaker(memory_factory):
    memory = memory_factory(paper(), store="speaker", embedder=SameVector(), consolidator=supersede)
    alice = {**GUITAR, "id": "alice", "speaker": "Alice", "content": "Alice plays jazz guitar in Porto."}
    assert added(memory, JAZZ, alice) == ["KEEP_BOTH", "SUPERSEDE"]  # theirs: any speaker's record
    ours = memory_factory(store="speaker-ours", embedder=SameVector(), consolidator=supersede)
    assert added(ours, JAZZ, alice) == ["KEEP_BOTH", "KEEP_BOTH"]  # ours: the same speaker only


@pytest.mark.parametrize(
    ("stored", "arriving", "action"),
    [
        ("2023-08-01T10:00", "2023-05-01T10:00", "KEEP_BOTH"),  # older than the stored record: never
        ("2023-05-01T10:00", "2023-08-01T10:00", "SUPERSEDE"),  # newer: may
        # same session: a candidate for theirs; the runtime's time order then goes by id ("guitar" is
        # before "jazz"), so the arriving record is history of the stored one
        ("2023-05-01T10:00", "2023-05-01T10:00", "HISTORY"),
        (None, "2023-05-01T10:00", "HISTORY"),  # no session time: the stored record's is when it was stored
    ],
)
def test_paper_filter_never_lets_an_older_record_replace_a_newer_one(
    memory_factory, stored, arriving, action
):
    memory = memory_factory(paper(), store="time", embedder=SameVector(), consolidator=supersede)
    assert added(memory, {**JAZZ, "session_time": stored}, {**GUITAR, "session_time": arriving}) == [
        "KEEP_BOTH",
        action,
    ]
    assert memory.get("jazz", user_id="bob")["status"] == (
        "superseded" if action == "SUPERSEDE" else "active"
    )
    if action == "KEEP_BOTH":  # this runtime's filter takes it, and time decides: the older is history
        ours = memory_factory(store="time-ours", embedder=SameVector(), consolidator=supersede)
        assert added(ours, {**JAZZ, "session_time": stored}, {**GUITAR, "session_time": arriving})[1] == (
            "HISTORY"
        )
        assert ours.get("jazz", user_id="bob")["status"] == "active"
