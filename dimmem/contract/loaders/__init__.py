"""Dialogue loaders: each turns one input format into `Conversation`s, or fails naming file, record and
field."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dimmem.contract.conversation import Conversation
from dimmem.contract.loaders.chat_jsonl import (
    conversation_from_messages,
    conversation_messages,
    load_chat_jsonl,
)
from dimmem.contract.loaders.locomo import load_locomo
from dimmem.contract.loaders.longmemeval import load_longmemeval
from dimmem.contract.loaders.memorybank import load_memorybank

LOADERS: dict[str, Callable[[str | Path], list[Conversation]]] = {
    "locomo": load_locomo,
    "longmemeval": load_longmemeval,
    "chat_jsonl": load_chat_jsonl,
    "memorybank": load_memorybank,
}


def load_conversations(fmt: str, path: str | Path) -> list[Conversation]:
    if fmt not in LOADERS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {sorted(LOADERS)}")
    if Path(path).is_dir():
        raise IsADirectoryError(f"{path}: a folder, expected a {fmt} file")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such file")
    return LOADERS[fmt](path)


__all__ = ["LOADERS", "load_conversations", "conversation_from_messages", "conversation_messages"]
