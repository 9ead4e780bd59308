"""Every validator rule with a failing and a passing case; issues name memory index, field and rule."""

import json

import pytest

from dimmem.contract.records import memory_record
from dimmem.contract.validate import RULES, TASK_RULES, TurnScope, time_problem, validate

# A window t1..t5: t1-t2 are overlap context, t3-t5 are new.
SCOPE = TurnScope(
    speakers={"t1": "Ann", "t2": "Bob", "t3": "Ann", "t4": "Bob", "t5": "Ann"},
    new=frozenset({"t3", "t4", "t5"}),
)


def memory(**overrides):
    base = memory_record(
        source_turns=["t3"],
        speaker="Ann",
        content="Ann adopted a cat named Miso on 2024-01-02.",
        type="episodic",
        time="2024-01-02",
        location="Lisbon",
        keywords=["Ann", "cat", "Miso"],
    )
    return {**base, **overrides}


def extract(*memories):
    return json.dumps({"memories": list(memories)})


def test_valid_answer_has_no_issues():
    result = validate("extract", extract(memory(), memory(source_turns=["t4", "t5"], speaker="Bob")), SCOPE)
    assert result.ok and result.issues == [] and result.value["memories"][0]["speaker"] == "Ann"


def test_empty_memory_list_is_valid():
    assert validate("extract", '{"memories": []}', SCOPE).ok


# (rule, failing memory overrides, passing memory overrides)
MEMORY_CASES = [
    ("content_empty", {"content": "  "}, {"content": "Ann likes tea."}),
    ("time_format", {"time": "May 7, 2023"}, {"time": "2023-05"}),
    ("time_format", {"time": "2023-02-30"}, {"time": "2024-02-29"}),
    ("time_format", {"time": "2023-06/2023-05"}, {"time": "2023-05-01/2023-06"}),
    ("time_format", {"time": "2023-05-07T10:00"}, {"time": None}),
    ("source_turns_empty", {"source_turns": []}, {"source_turns": ["t5"]}),
    ("source_turns_unknown", {"source_turns": ["t9"]}, {"source_turns": ["t3"]}),
    ("source_turns_overlap", {"source_turns": ["t1", "t3"]}, {"source_turns": ["t3", "t5"]}),
    ("speaker_mismatch", {"speaker": "Bob"}, {"speaker": "Ann"}),
    ("keywords_empty", {"keywords": []}, {"keywords": ["cat"]}),
    ("keywords_empty", {"keywords": ["cat", " "]}, {"keywords": ["cat", "Miso"]}),
    ("keywords_duplicate", {"keywords": ["Cat", "cat"]}, {"keywords": ["cat", "cats"]}),
    ("schema", {"type": "opinion"}, {"type": "profile"}),
    ("dimension_blank", {"location": ""}, {"location": None}),
    ("dimension_blank", {"purpose": " "}, {"purpose": "to relax"}),
]


@pytest.mark.parametrize("rule,bad,good", MEMORY_CASES)
def test_memory_rule(rule, bad, good):
    failing = validate("extract", extract(memory(), memory(**bad)), SCOPE)
    assert rule in failing.rules_broken()
    hit = next(i for i in failing.issues if i.rule == rule)
    assert hit.index == 1  # names the offending memory, not the valid one before it
    field = next(iter(bad))
    assert hit.field == field and f"memories[1].{field}: [{rule}]" in str(hit)
    assert validate("extract", extract(memory(), memory(**good)), SCOPE).ok


@pytest.mark.parametrize(
    "text,why",
    [
        ("Here are the memories: {}", "not valid JSON"),
        ('{"memories": [', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_json_rule(text, why):
    result = validate("extract", text, SCOPE)
    assert result.value is None and result.rules_broken() == ["json"] and why in result.report()


def test_markdown_fence_is_tolerated():
    assert validate("extract", "```json\n" + extract(memory()) + "\n```", SCOPE).ok


def test_schema_rule_names_missing_and_extra_fields():
    m = memory()
    del m["reason"]
    result = validate("extract", extract(memory(), {**m, "confidence": 0.9}), SCOPE)
    messages = [str(i) for i in result.issues if i.rule == "schema"]
    assert any("'reason' is a required property" in s for s in messages)
    assert any("confidence" in s for s in messages)
    assert all(i.index == 1 for i in result.issues)


def test_wrong_types_do_not_crash_semantic_rules():
    result = validate(
        "extract", extract(memory(source_turns="t3", keywords="cat", time=5, content=None)), SCOPE
    )
    assert result.rules_broken() == ["schema"]


def test_extraction_needs_a_scope():
    with pytest.raises(ValueError, match="TurnScope"):
        validate("extract", extract(memory()))


def test_report_is_one_readable_line_per_issue():
    result = validate("extract", extract(memory(time="yesterday", speaker="Bob")), SCOPE)
    lines = result.report().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("memories[0].time: [time_format]")
    assert lines[1].startswith("memories[0].speaker: [speaker_mismatch]")


def query(**overrides):
    return {
        "target_types": ["episodic"],
        "time": None,
        "location": None,
        "keywords": ["cat"],
        "need_assistant_context": False,
        **overrides,
    }


@pytest.mark.parametrize(
    "rule,bad,good",
    [
        ("time_format", {"time": "last week"}, {"time": "2024-01"}),
        ("keywords_empty", {"keywords": []}, {"keywords": ["Miso"]}),
        ("keywords_duplicate", {"keywords": ["Miso", "miso"]}, {"keywords": ["Miso"]}),
        ("schema", {"need_assistant_context": "no"}, {"need_assistant_context": True}),
    ],
)
def test_parse_query_rules(rule, bad, good):
    failing = validate("parse_query", query(**bad))
    assert failing.rules_broken() == [rule]
    assert failing.issues[0].index is None and failing.issues[0].field == next(iter(bad))
    assert validate("parse_query", query(**good)).ok


CONSOLIDATE_SCOPE = TurnScope(speakers={"D1:3": "Ann", "D4:2": "Ann"}, new=frozenset({"D1:3", "D4:2"}))


@pytest.mark.parametrize(
    "bad,good",
    [
        ({"action": "MERGE", "memory": None}, {"action": "KEEP_BOTH", "memory": None}),
        (
            {"action": "KEEP_BOTH", "memory": memory(source_turns=["D1:3"])},
            {"action": "SUPERSEDE", "memory": memory(source_turns=["D4:2"])},
        ),
    ],
)
def test_consolidate_action_memory_rule(bad, good):
    assert validate("consolidate", bad, CONSOLIDATE_SCOPE).rules_broken() == ["action_memory"]
    assert validate("consolidate", good, CONSOLIDATE_SCOPE).ok


def test_consolidated_memory_gets_the_memory_rules():
    result = validate(
        "consolidate",
        {"action": "MERGE", "memory": memory(source_turns=["D9:9"], time="soon")},
        CONSOLIDATE_SCOPE,
    )
    assert result.rules_broken() == ["source_turns_unknown", "time_format"]
    assert {i.field for i in result.issues} == {"source_turns", "time"}


def test_every_rule_is_used_by_some_task():
    used = {rule for rules in TASK_RULES.values() for rule in rules}
    assert used == set(RULES)


@pytest.mark.parametrize(
    "value,ok",
    [
        ("2023", True),
        ("2023-05", True),
        ("2023-05-07", True),
        ("2023/2024", True),
        ("2023-05-07/2023-05-07", True),
        ("23-05-07", False),
        ("2023-13", False),
        ("2023-5-7", False),
        ("2023-05-07/", False),
        ("2024/2023", False),
        ("2023/2024/2025", False),
        ("", False),
    ],
)
def test_time_format(value, ok):
    assert (time_problem(value) is None) == ok


@pytest.mark.parametrize("value", ["2023-05-01\n", "2023\n", "２０２３-05", "٢٠٢٣", "2023-05-01/2023-06\n"])
def test_time_must_be_ascii_iso_and_nothing_after_it(value):
    """`$` let a trailing newline through and `\\d` matched any script's digits (found by Hypothesis)."""
    assert time_problem(value) is not None


def test_complete_memories_of_an_answer_cut_off():
    from dimmem.contract.validate import complete_memories

    one = '{"source_turns": ["t1"], "speaker": "Ann", "content": "Ann adopted Rex.", "keywords": ["Rex"]}'
    cut = '{"memories": [' + one + ", " + one[:30]
    assert complete_memories(cut) == {"memories": [json.loads(one)]}  # the cut one dropped
    assert complete_memories('{"memories": [' + one + "," + one + "]}") == {"memories": [json.loads(one)] * 2}
    assert complete_memories('{"memories": [{"source_tu') is None  # nothing complete: the window failed
    assert complete_memories("Sure! Here are the memories") is None
    assert complete_memories('{"other": [') is None
