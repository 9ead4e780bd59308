from __future__ import annotations

import os

import pytest

from dimmem.contract.conversation import Conversation, Turn
from dimmem.paths import shared_data

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a model hub: everything they load is local


@pytest.fixture(scope="session")
def locomo_path():
    return shared_data("locomo/locomo10.json")


@pytest.fixture(scope="session")
def memorybank_path():
    return shared_data("corpora/memorybank_en/memory_bank_en.json")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from dimmem.contract.tokens import load_tokenizer

    return load_tokenizer(str(shared_data("qwen3-tokenizer")))


def make_conversation(n_turns: int, sessions: int = 1, text: str = "hello there") -> Conversation:
    """A two-person conversation of n_turns spread over `sessions` dated sessions."""
    per = -(-n_turns // sessions)
    turns = [
        Turn(
            id=f"D{i // per + 1}:{i % per + 1}",
            speaker=("Ann", "Bob")[i % 2],
            role="participant",
            text=f"{text} {i}",
            session_id=f"S{i // per + 1}",
            session_time=f"2024-01-{i // per + 1:02d}T10:00",
        )
        for i in range(n_turns)
    ]
    return Conversation(id="c", turns=turns)
