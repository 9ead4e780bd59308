"""Query-aware retrieval: the rule parser's places, the dimension path voting only with what a query
states, score fusion against RRF on crafted rankings, and BM25 on its calibrated scale."""

import pytest

from dimmem.contract.records import memory_record
from dimmem.runtime.query import parse_location, parse_query_rules
from dimmem.runtime.retrieval import dimension_ceiling, rrf, score_fusion


@pytest.mark.parametrize(
    ("question", "place"),
    [
        ("What did Bob do at the harbor?", "the harbor"),
        ("What did Bob do at the community center yesterday?", "the community center"),
        ("What did Bob do at Eagle Peak last week?", "Eagle Peak"),
        ("Who in Bob's family works in Kyoto?", "Kyoto"),
        ("Is Bob in Lisbon now?", "Lisbon"),
        ("What did Bob do in June 2023?", None),
        ("What is Bob doing at the moment?", None),
        ("Where did she go in the morning?", None),
        ("Did Mel go to a concert in 2023?", None),
        ("what did caroline do in paris?", None),  # lower case: not told from a common noun
        ("in the", None),
    ],
)
def test_rule_parser_finds_the_place_a_question_names(question, place):
    assert parse_location(question) == place
    assert parse_query_rules(question, "2023-07-01")["location"] == place


def test_score_fusion_ignores_a_path_that_cannot_tell_its_candidates_apart():
    # bm25 matched only a name every record shares: flat scores; dense knows the answer
    paths = {
        "bm25": [("x", 0.0102), ("y", 0.0101), ("answer", 0.0100)],
        "dense": [("answer", 0.71), ("x", 0.35), ("y", 0.30)],
        "dimension": [],
    }
    assert [rid for rid, _, _ in score_fusion(paths)][0] == "answer"
    assert [rid for rid, _, _ in rrf(paths)][0] == "x"  # rank fusion follows the flat path's order


def test_score_fusion_gives_a_lone_candidate_its_whole_score_and_keeps_every_path():
    paths = {"bm25": [("rare", 0.4)], "dense": [("a", 0.6), ("b", 0.5)], "dimension": [("rare", 0.9)]}
    fused = score_fusion(paths)
    assert fused[0][0] == "rare" and fused[0][1] == pytest.approx(1.3)
    assert fused[0][2] == {"bm25": {"rank": 1, "score": 0.4}, "dimension": {"rank": 1, "score": 0.9}}
    assert {rid for rid, _, _ in fused} == {"rare", "a", "b"}
    # weights scale a path's lift; a path weighted 0 adds nothing
    only_dense = score_fusion(paths, {"dense": 1.0})
    assert only_dense[0][0] == "a" and only_dense[0][1] == pytest.approx(0.1)


def test_dimension_ceiling_counts_only_what_the_query_states():
    assert dimension_ceiling({"keywords": ["Bob"]}) == 1.5
    assert dimension_ceiling({"time": "2023-05", "location": "Kyoto", "keywords": ["Bob"]}) == 4.5


@pytest.fixture
def memory(tmp_path):
    from dimmem.runtime.embed import make_embedder
    from dimmem.runtime.memory import Memory

    memory = Memory({"store": str(tmp_path / "m.sqlite")}, embedder=make_embedder())

    def bob(id, **fields):
        return {"id": id, **memory_record(speaker="Bob", source_turns=["D1:1"], **fields)}

    memory.add_records(
        [
            bob("hike", content="Bob went hiking at the harbor on 2023-05-07.", type="episodic",
                time="2023-05-07", location="the harbor", keywords=["Bob", "hiking", "the harbor"]),
            bob("race", content="Bob ran a race in the park on 2023-08-01.", type="episodic",
                time="2023-08-01", location="the park", keywords=["Bob", "race"]),
            bob("jazz", content="Bob loves jazz.", type="profile", keywords=["Bob", "jazz"]),
        ],
        user_id="bob",
        consolidate=False,
    )  # fmt: skip
    yield memory
    memory.close()


def test_dimension_path_votes_only_with_what_the_query_states(memory):
    def dimension(question):
        parsed = parse_query_rules(question, "2023-09-01")
        return [rid for rid, _ in memory.paths(question, "bob", parsed)["dimension"]]

    assert dimension("Tell me about Bob") == []  # no time, place or type: the keywords are BM25's
    # "did": episodic records vote; the one of the stated time or place first
    assert dimension("What did Bob do in May 2023?") == ["hike", "race"]
    assert dimension("What did Bob do at the park?") == ["race", "hike"]
    assert dimension("What music does Bob love?") == ["jazz"]  # a profile cue: the profile records
    question = "What did Bob do in May 2023?"
    scores = memory.paths(question, "bob", parse_query_rules(question, "2023-09-01"))
    assert all(0 < s <= 1 for _, s in scores["dimension"]) and all(0 < s < 1 for _, s in scores["bm25"])
