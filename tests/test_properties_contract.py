"""Property-based tests (Hypothesis) of the record contract, the validator and windowing.

- Any valid record (generated against a random window scope) round-trips through `canonical_json`,
  validates, and is accepted by the JSON Schemas generated from the one definition (the task schema and
  the window's own schema); the validator's schema issues are exactly jsonschema's verdict, and the
  pydantic models (which `canonical_json` uses) agree with jsonschema on what is valid.
- The validator never raises on arbitrary JSON-ish input: it returns issues. `time_problem` agrees
  with `parse_span`, and what either accepts is the ASCII ISO 8601 form the contract states.
- Windowing over random conversations, window sizes, overlaps and token budgets (a synthetic token
  counter): every turn is new in exactly one window, in order; each context is the turns just before its
  new part; windows keep W, O and the budget, unless flagged oversized (one turn alone over budget).
"""

from __future__ import annotations

import json
import re
from datetime import date

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import ValidationError

from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.records import (
    DIMENSIONS,
    MEMORY_FIELDS,
    MEMORY_TYPES,
    TASK_MODELS,
    canonical_json,
    json_schema,
    max_memories,
    memory_record,
    window_schema,
)
from dimmem.contract.timespan import parse_span
from dimmem.contract.validate import TurnScope, time_problem, validate
from dimmem.contract.windows import check_partition, make_windows, window_conversations

settings.register_profile(
    "contract", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
FAST = settings(settings.get_profile("contract"))

TASKS = tuple(TASK_MODELS)
ISO_TIME = re.compile(r"\d{4}(-\d{2}(-\d{2})?)?(/\d{4}(-\d{2}(-\d{2})?)?)?", re.ASCII)

# ---- generators --------------------------------------------------------------------------------------

words = st.text(min_size=1, max_size=20).filter(lambda s: s.strip())
nullable_words = st.none() | words


def _part(day: date, grain: str) -> tuple[str, date]:
    """`day` written at a granularity, and the first day of the span that text means."""
    if grain == "day":
        return day.isoformat(), day
    if grain == "month":
        return f"{day.year:04d}-{day.month:02d}", day.replace(day=1)
    return f"{day.year:04d}", day.replace(month=1, day=1)


grains = st.sampled_from(["day", "month", "year"])


@st.composite
def valid_times(draw) -> str:
    first, first_start = _part(draw(st.dates()), draw(grains))
    if not draw(st.booleans()):
        return first
    last, last_start = _part(draw(st.dates()), draw(grains))
    if last_start < first_start:
        (first, first_start), (last, last_start) = (last, last_start), (first, first_start)
    assume(first_start <= last_start)
    return f"{first}/{last}"


@st.composite
def scopes(draw) -> TurnScope:
    """A window: t1..tn spoken by a few speakers, the first `context` of them overlap context."""
    n = draw(st.integers(1, 12))
    speakers = draw(st.lists(words, min_size=1, max_size=3, unique=True))
    spoken = {f"t{i}": draw(st.sampled_from(speakers)) for i in range(1, n + 1)}
    context = draw(st.integers(0, n - 1))
    return TurnScope(spoken, frozenset(f"t{i}" for i in range(context + 1, n + 1)))


def unique_keywords():
    return st.lists(words, min_size=1, max_size=5, unique_by=lambda k: k.strip().casefold())


@st.composite
def valid_memories(draw, scope: TurnScope) -> dict:
    citable = scope.citable()
    speaker = draw(st.sampled_from(sorted(citable)))
    turns = draw(st.lists(st.sampled_from(citable[speaker]), min_size=1, max_size=3, unique=True))
    return memory_record(
        source_turns=turns,
        speaker=speaker,
        content=draw(words),
        type=draw(st.sampled_from(MEMORY_TYPES)),
        time=draw(st.none() | valid_times()),
        **{name: draw(nullable_words) for name in DIMENSIONS},  # every free-text dimension, in order
        keywords=draw(unique_keywords()),
    )


@st.composite
def valid_answers(draw) -> tuple[str, dict, TurnScope]:
    """(task, a valid answer, the scope it was written for)."""
    scope = draw(scopes())
    task = draw(st.sampled_from(TASKS))
    if task == "extract":
        return task, {"memories": draw(st.lists(valid_memories(scope), max_size=4))}, scope
    if task == "parse_query":
        value = {
            "target_types": draw(st.lists(st.sampled_from(MEMORY_TYPES), max_size=3)),
            "time": draw(st.none() | valid_times()),
            "location": draw(nullable_words),
            "keywords": draw(unique_keywords()),
            "need_assistant_context": draw(st.booleans()),
        }
        return task, value, scope
    action = draw(st.sampled_from(["MERGE", "SUPERSEDE", "KEEP_BOTH"]))
    memory = None if action == "KEEP_BOTH" else draw(valid_memories(scope))
    return task, {"action": action, "memory": memory}, scope


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# a memory-shaped object whose every field may hold anything, and may be missing or joined by another
memory_like = st.fixed_dictionaries(
    {},
    optional={name: json_values for name in (*MEMORY_FIELDS, "extra")},
)


@st.composite
def mutated_answers(draw) -> tuple[str, dict, TurnScope]:
    """A valid answer with one thing broken in it (or nothing): a field removed, added, or replaced by
    any JSON value."""
    task, value, scope = draw(valid_answers())
    target = value
    if task == "extract" and value["memories"]:
        target = draw(st.sampled_from(value["memories"]))
    elif task == "consolidate" and value["memory"] is not None and draw(st.booleans()):
        target = value["memory"]
    key = draw(st.sampled_from(sorted(target)))
    how = draw(st.sampled_from(["drop", "add", "replace", "keep"]))
    if how == "drop":
        del target[key]
    elif how == "add":
        target[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    elif how == "replace":
        target[key] = draw(json_values)
    return task, value, scope


# ---- the record contract -----------------------------------------------------------------------------


@FAST
@given(valid_answers())
def test_valid_answers_round_trip_validate_and_fit_the_schemas(answer):
    task, value, scope = answer
    text = canonical_json(task, value)
    assert json.loads(text) == value  # nothing lost, nothing added
    assert canonical_json(task, json.loads(text)) == text  # canonical: a fixed point
    assert list(json.loads(text)) == list(TASK_MODELS[task].model_fields)  # keys in contract order
    result = validate(task, text, scope)
    assert result.ok, result.report()
    assert result.value == value
    assert Draft202012Validator(json_schema(task)).is_valid(value)
    if task == "extract":  # the window schema also bounds the count (a decoding guard, no rule)
        fits = len(value["memories"]) <= max_memories(scope.citable())
        assert Draft202012Validator(window_schema(scope.citable())).is_valid(value) == fits


def test_generated_schemas_are_valid_json_schemas():
    for task in TASKS:
        Draft202012Validator.check_schema(json_schema(task))
    Draft202012Validator.check_schema(window_schema({"Ann": ["t2", "t3"], "Bob": ["t4"]}))
    Draft202012Validator.check_schema(window_schema({}))


@FAST
@given(mutated_answers())
def test_schema_issues_are_exactly_jsonschemas_verdict(answer):
    task, value, scope = answer
    schema_valid = Draft202012Validator(json_schema(task)).is_valid(value)
    result = validate(task, value, scope)
    assert ("schema" in result.rules_broken()) == (not schema_valid), result.report()
    try:  # the pydantic models behind canonical_json accept exactly what the schema accepts
        TASK_MODELS[task].model_validate(value)
        model_valid = True
    except ValidationError:
        model_valid = False
    assert model_valid == schema_valid
    if task == "extract" and schema_valid and result.ok:  # valid by the rules: the window schema agrees
        fits = len(value["memories"]) <= max_memories(scope.citable())
        assert Draft202012Validator(window_schema(scope.citable())).is_valid(value) == fits


# ---- the validator never raises ----------------------------------------------------------------------


@FAST
@given(st.sampled_from(TASKS), st.one_of(json_values, st.text(max_size=40)), scopes())
def test_validator_returns_issues_for_anything(task, anything, scope):
    output = anything if isinstance(anything, (str, dict)) else json.dumps(anything)
    result = validate(task, output, scope)
    assert result.ok == (not result.issues)
    assert all(issue.rule in {"json", "schema"} or issue.rule.islower() for issue in result.issues)
    result.report()  # every issue renders
    if not isinstance(anything, dict) and not (
        isinstance(anything, str) and anything.strip().startswith("{")
    ):
        assert result.value is None and result.rules_broken() == ["json"]


@FAST
@given(st.sampled_from(["extract", "consolidate"]), st.lists(memory_like, max_size=3), scopes())
def test_validator_returns_issues_for_any_memory_shape(task, memories, scope):
    value = (
        {"memories": memories}
        if task == "extract"
        else {"action": "MERGE", "memory": (memories or [None])[0]}
    )
    result = validate(task, value, scope)
    result.report()
    assert not result.ok or all(set(m) == set(MEMORY_FIELDS) for m in memories)


# ---- time --------------------------------------------------------------------------------------------


def _accepts(value: str) -> bool:
    try:
        parse_span(value)
    except ValueError:
        return False
    return True


@FAST
@given(valid_times())
def test_generated_times_are_accepted(value):
    assert time_problem(value) is None and _accepts(value)
    start, end = parse_span(value)
    assert start <= end


time_like = st.one_of(
    st.text(max_size=24),
    st.text(alphabet="0123456789-/\n ٠١٢３", max_size=24),
    valid_times().map(lambda t: t + "\n"),
)


@FAST
@given(time_like)
def test_time_problem_agrees_with_parse_span_and_accepts_only_iso(value):
    problem = time_problem(value)
    assert (problem is None) == _accepts(value)
    if problem is None:
        assert ISO_TIME.fullmatch(value), f"{value!r} accepted but not ISO 8601 in ASCII"
    else:
        assert isinstance(problem, str) and problem  # a message, never an exception


# ---- windowing ---------------------------------------------------------------------------------------


@st.composite
def conversations(draw) -> Conversation:
    n = draw(st.integers(1, 60))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=4))) if n > 1 else []
    sizes = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    turns, session = [], 0
    for i in range(n):
        session += i in cuts
        turns.append(
            Turn(
                id=f"D{session + 1}:{i + 1}",
                speaker=("Ann", "Bob")[i % 2],
                role="participant",
                text="x" * sizes[i],
                session_id=f"S{session + 1}",
                session_time=f"2024-01-{session + 1:02d}",
            )
        )
    return Conversation(id=f"conv{n}", turns=turns)


OVERHEAD = 30  # the synthetic prompt's fixed part, in "tokens"


def count_tokens(window) -> int:
    return OVERHEAD + sum(len(turn.text) for turn in window.turns)


@FAST
@given(
    conversations(),
    st.integers(1, 30),
    st.data(),
    st.none() | st.integers(OVERHEAD + 1, OVERHEAD + 400),
)
def test_windows_partition_every_conversation(conversation, window, data, budget):
    overlap = data.draw(st.integers(0, window - 1), label="overlap")
    counter = count_tokens if budget is not None or data.draw(st.booleans(), label="count") else None
    windows = make_windows(conversation, window, overlap, budget, counter)
    check_partition(conversation, windows)  # the library's own check agrees
    ids = [t.id for t in conversation.turns]
    assert [t.id for w in windows for t in w.new] == ids  # each turn new exactly once, in order
    position = 0
    for i, w in enumerate(windows):
        assert w.index == i and w.new and w.conversation_id == conversation.id
        assert len(w.context) <= overlap and len(w.turns) <= window
        assert [t.id for t in w.context] == ids[position - len(w.context) : position]  # just before
        if i == 0:
            assert not w.context
        if counter is not None:
            assert w.prompt_tokens == count_tokens(w)
        else:
            assert w.prompt_tokens is None
        if budget is None:
            assert not w.oversized
            # no budget: every window takes as many new turns as W and O allow
            assert len(w.new) == min(window - len(w.context), len(ids) - position)
        elif w.oversized:
            assert len(w.new) == 1 and not w.context and w.prompt_tokens > budget
        else:
            assert w.prompt_tokens <= budget
        position += len(w.new)
    # the same over several conversations at once (window_conversations checks each partition)
    assert window_conversations([conversation], window, overlap, budget, counter) == windows


@FAST
@given(st.integers(-3, 5), st.integers(-3, 6))
def test_impossible_window_settings_are_refused(window, overlap):
    conversation = Conversation("c", [Turn("D1:1", "Ann", "participant", "hi", "S1", None)])
    if window >= 1 and 0 <= overlap < window:
        assert make_windows(conversation, window, overlap)
    else:
        with pytest.raises(ValueError, match="need window >= 1 and 0 <= overlap < window"):
            make_windows(conversation, window, overlap)
