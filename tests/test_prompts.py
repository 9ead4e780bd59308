"""Versioned prompt files: every rule the validator checks is stated; the window is rendered faithfully."""

import re

import pytest
from conftest import make_conversation

from dimmem.contract.prompts import (
    available,
    consolidate_messages,
    extract_messages,
    human_date,
    load_prompt,
    parse_query_messages,
)
from dimmem.contract.records import TASK_MODELS
from dimmem.contract.tokens import count_prompt_tokens, render_prompt
from dimmem.contract.validate import TASK_RULES
from dimmem.contract.windows import make_windows


@pytest.mark.parametrize("task", TASK_MODELS)
def test_prompt_states_exactly_the_rules_its_answers_are_checked_against(task):
    system = load_prompt(task).system
    stated = set(re.findall(r"^\s*- \[(\w+)\]", system, flags=re.MULTILINE))
    assert stated == set(TASK_RULES[task])


def test_versions_and_identity():
    assert set(available()) == set(TASK_MODELS) | {"repair"}
    prompt = load_prompt("extract")
    assert prompt.id == f"extract/v{prompt.version}" and prompt == load_prompt("extract", prompt.version)
    assert re.fullmatch(r"[0-9a-f]{12}", prompt.sha)
    edited = prompt.__class__(prompt.task, prompt.version, prompt.system + " ", prompt.user)
    assert edited.sha != prompt.sha
    with pytest.raises(FileNotFoundError, match="extract/v99"):
        load_prompt("extract", 99)


def test_extract_prompt_marks_context_and_new_turns_with_session_dates():
    conv = make_conversation(12, sessions=2)
    window = make_windows(conv, 5, 2)[1]  # context D1:4, D1:5 in session 1; new turns D1:6, D2:1, D2:2
    system, user = extract_messages(window)
    assert system["role"] == "system" and user["role"] == "user"
    text = user["content"]
    context, new = text.split("## New turns")
    assert "## Context" in context and "do not extract" in context
    assert [line.split()[0] for line in context.splitlines() if line.startswith("t")] == ["t1", "t2"]
    assert [line.split()[0] for line in new.splitlines() if line.startswith("t")] == ["t3", "t4", "t5"]
    assert "[session of 2024-01-01 (Monday) 10:00]" in context
    assert "[session of 2024-01-02 (Tuesday) 10:00]" in new
    assert "[session of 2024-01-01 (Monday) 10:00]" in new  # D1:6 keeps its own session date
    assert f"t3 {window.new[0].speaker}: {window.new[0].text}" in new


def test_first_window_has_no_context_section():
    _, user = extract_messages(make_windows(make_conversation(5), 25, 5)[0])
    assert "## Context" not in user["content"] and "## New turns" in user["content"]


def test_other_task_prompts_render():
    _, user = parse_query_messages("What did Ann adopt last week?", "2024-01-09T10:00", ["Ann", "Bob"])
    assert (
        "Reference date: 2024-01-09 (Tuesday) 10:00" in user["content"]
        and "Participants: Ann, Bob" in user["content"]
    )
    _, user = consolidate_messages(
        {"content": "Ann moved to Porto."}, {"content": "Ann lives in Lisbon."}, "2024-02", "2023-06"
    )
    assert (
        "Ann lives in Lisbon" in user["content"].split("New memory")[0]
        and "(recorded 2024-02)" in user["content"]
    )


def test_human_date():
    assert human_date("2023-05-08T13:56") == "2023-05-08 (Monday) 13:56"
    assert human_date("2023-05-08") == "2023-05-08 (Monday)"
    assert human_date(None) == "unknown date"


def test_qwen3_render_has_thinking_disabled_and_counts_tokens(qwen3_tokenizer):
    messages = extract_messages(make_windows(make_conversation(5), 25, 5)[0])
    text = render_prompt(qwen3_tokenizer, messages)
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    n = count_prompt_tokens(qwen3_tokenizer, messages)
    assert n == len(qwen3_tokenizer(text, add_special_tokens=False)["input_ids"]) and 500 < n < 3000
