"""Overlap-aware windowing: partition, overlap context, token budget, oversized turns."""

import json
from dataclasses import replace

import pytest
from conftest import make_conversation

from dimmem.contract.loaders import load_conversations
from dimmem.contract.prompts import extract_prompt_counter
from dimmem.contract.windows import check_partition, job_windows, make_windows, window_record


def chars(window):
    """A cheap stand-in token count: characters of the turn texts."""
    return sum(len(t.text) for t in window.turns)


@pytest.mark.parametrize(
    "n,w,o", [(1, 25, 5), (25, 25, 5), (26, 25, 5), (100, 25, 5), (97, 15, 3), (10, 4, 0), (10, 2, 1)]
)
def test_new_parts_partition_and_context_precedes(n, w, o):
    conv = make_conversation(n, sessions=3)
    windows = make_windows(conv, w, o)
    check_partition(conv, windows)
    assert windows[0].context == () and len(windows[0].new) == min(n, w)
    for prev, win in zip(windows, windows[1:]):
        assert win.context == (prev.turns[-o:] if o else ())
        assert len(win.turns) <= w
    assert [win.index for win in windows] == list(range(len(windows)))


def test_stride_is_window_minus_overlap():
    windows = make_windows(make_conversation(100), 25, 5)
    assert [len(w.new) for w in windows] == [25, 20, 20, 20, 15]


def test_local_ids_scope_and_pointer_back():
    win = make_windows(make_conversation(30), 25, 5)[1]
    assert win.local_ids[:2] == ["t1", "t2"] and len(win.local_ids) == 10
    scope = win.scope
    assert scope.new == frozenset(f"t{i}" for i in range(6, 11))
    assert scope.speakers["t1"] == win.context[0].speaker
    assert win.global_ids(["t6", "t10"]) == [win.new[0].id, win.new[-1].id]


def test_budget_caps_every_window_and_keeps_partition():
    conv = make_conversation(60, text="x" * 20)
    windows = make_windows(conv, 25, 5, max_tokens=300, count_tokens=chars)
    check_partition(conv, windows)
    assert all(w.prompt_tokens == chars(w) <= 300 for w in windows)
    assert max(len(w.turns) for w in windows) < 25  # the budget, not W, was binding
    assert all(len(w.context) == 5 for w in windows[1:])  # new turns give way before context does


def test_budget_drops_context_before_flagging():
    conv = make_conversation(4, text="y" * 40)  # ~42 chars a turn
    windows = make_windows(conv, 3, 2, max_tokens=100, count_tokens=chars)
    check_partition(conv, windows)
    assert all(w.prompt_tokens <= 100 and not w.oversized for w in windows)
    assert [len(w.context) for w in windows[1:]] == [1] * (len(windows) - 1)


def test_oversized_turn_is_flagged_never_dropped():
    conv = make_conversation(5)
    long_turn = replace(conv.turns[2], text="z" * 500)
    conv.turns[2] = long_turn
    windows = make_windows(conv, 4, 1, max_tokens=100, count_tokens=chars)
    check_partition(conv, windows)
    flagged = [w for w in windows if w.oversized]
    assert len(flagged) == 1 and flagged[0].new == (long_turn,) and flagged[0].context == ()
    assert all(w.prompt_tokens <= 100 for w in windows if not w.oversized)


@pytest.mark.parametrize("w,o", [(0, 0), (5, 5), (5, -1)])
def test_invalid_window_sizes(w, o):
    with pytest.raises(ValueError, match="overlap"):
        make_windows(make_conversation(5), w, o)


def test_budget_needs_a_counter():
    with pytest.raises(ValueError, match="count_tokens"):
        make_windows(make_conversation(5), 4, 1, max_tokens=10)


def test_check_partition_catches_a_lost_turn():
    conv = make_conversation(30)
    windows = make_windows(conv, 25, 5)
    with pytest.raises(ValueError, match="cover"):
        check_partition(conv, windows[:-1])


@pytest.mark.slow
@pytest.mark.parametrize("w,o,budget", [(25, 5, 4096), (15, 3, 4096), (25, 5, 1536)])
def test_all_locomo_conversations_with_the_real_tokenizer(locomo_path, qwen3_tokenizer, w, o, budget):
    count = extract_prompt_counter(qwen3_tokenizer)
    for conv in load_conversations("locomo", locomo_path):
        windows = make_windows(conv, w, o, max_tokens=budget, count_tokens=count)
        check_partition(conv, windows)
        assert not any(win.oversized for win in windows)
        assert all(win.prompt_tokens <= budget and len(win.turns) <= w for win in windows)
        # spot-check that the recorded count is the real rendered prompt length
        assert windows[-1].prompt_tokens == count(windows[-1])


def test_job_windows_reads_back_what_datagen_wrote_and_names_a_bad_line(tmp_path):
    """jobs.jsonl's windows come back as written (jobs without one skipped); a torn or foreign line is a
    ValueError naming the file and the line, not a bare JSON error."""
    windows = make_windows(make_conversation(9), 4, 1)
    rows = [{"id": w.id, "conversation_id": w.conversation_id, "window": window_record(w)} for w in windows]
    path = tmp_path / "jobs.jsonl"
    lines = [json.dumps(r) for r in rows[:2]] + [json.dumps({"id": "consolidate-1", "task": "consolidate"})]
    path.write_text("\n".join([*lines, json.dumps(rows[2])]) + "\n")
    assert [(row["id"], window) for row, window in job_windows(path)] == [(w.id, w) for w in windows[:3]]
    for bad in ('{"id": "w9", "window": {"ind', "[1, 2]", '{"id": "w9", "window": {"index": 0}}'):
        path.write_text("\n".join([*lines, bad]) + "\n")
        with pytest.raises(ValueError, match="jobs.jsonl: line 4: not a datagen job"):
            list(job_windows(path))
