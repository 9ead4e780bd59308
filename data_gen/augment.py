"""Speaker-renamed copies of annotated conversations, so a student learns to copy the speaker from the
window instead of expecting the corpus's few names.

A copy renames both participants everywhere they appear (turn speakers and text, the annotations' text
and person keys) to names drawn from `data/first_names.txt`; in a share of the copies the second name
differs from the first by one vowel ("Mara" and "Mira"), the look-alike case a model must not confuse.
Nicknames a conversation uses (a capitalized proper prefix of a name: "Mel" for "Melanie") are renamed
with the name. A copy's id is `<id>~r<n>`: the dataset splits a copy with its original (`base_id`).
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from functools import cache
from pathlib import Path

from dimmem.contract.conversation import Conversation

NAMES_FILE = Path(__file__).parent / "data" / "first_names.txt"
VOWELS = "aeiou"
RENAMED_METADATA = (
    "observation",
    "event_summary",
    "dimensions",
)  # what a copy keeps besides `source`, renamed


@cache
def first_names() -> tuple[str, ...]:
    lines = NAMES_FILE.read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def base_id(conversation_id: str) -> str:
    """The conversation a renamed copy was made from (itself for an original)."""
    return conversation_id.split("~", 1)[0]


def lookalike(name: str, rng: random.Random) -> str:
    """`name` with one vowel changed (never the first letter): a name a careless reader takes for it."""
    spots = [i for i, c in enumerate(name) if i and c in VOWELS]
    if not spots:
        return name + rng.choice(VOWELS)
    i = rng.choice(spots)
    return name[:i] + rng.choice([v for v in VOWELS if v != name[i]]) + name[i + 1 :]


def pick_names(speakers: list[str], rng: random.Random, lookalike_share: float) -> dict[str, str]:
    """A new name for each speaker, none of theirs; the second a look-alike of the first in a share."""
    pool = [n for n in first_names() if n not in speakers]
    chosen = rng.sample(pool, len(speakers))
    if len(speakers) >= 2 and rng.random() < lookalike_share:
        chosen[1] = lookalike(chosen[0], rng)
    return dict(zip(speakers, chosen))


def _pattern(conv: Conversation, mapping: dict[str, str]) -> tuple[re.Pattern, dict[str, str]]:
    """One regex for every name and nickname of the conversation, and what each becomes."""
    table = dict(mapping)
    words = {w for t in conv.turns for w in re.findall(r"\b[A-Z][a-z]{2,}\b", t.text)}
    for old, new in mapping.items():
        for word in words:
            if old.startswith(word) and word != old:
                table.setdefault(word, new)
    names = sorted(table, key=len, reverse=True)
    return re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b"), table


def rename(conv: Conversation, mapping: dict[str, str], copy: int) -> Conversation:
    """A copy of `conv` with its speakers renamed by `mapping`, id `<id>~r<copy>`."""
    pattern, table = _pattern(conv, mapping)

    def sub(text: str) -> str:
        return pattern.sub(lambda m: table[m.group(1)], text)

    def walk(value):
        if isinstance(value, str):
            return sub(value)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {mapping.get(k, k): walk(v) for k, v in value.items()}
        return value

    turns = [replace(t, speaker=mapping.get(t.speaker, t.speaker), text=sub(t.text)) for t in conv.turns]
    metadata = {k: walk(conv.metadata[k]) for k in RENAMED_METADATA if k in conv.metadata}
    metadata["source"] = conv.metadata.get("source")
    metadata["renamed_from"] = conv.id
    return Conversation(f"{conv.id}~r{copy}", turns, metadata)


def renamed_copies(
    conversations: list[Conversation], copies: int, seed: int, lookalike_share: float
) -> list[Conversation]:
    """`copies` renamed copies of each conversation, seeded (the same run makes the same names)."""
    rng = random.Random(seed)
    out = []
    for conv in conversations:
        for n in range(1, copies + 1):
            out.append(rename(conv, pick_names(conv.speakers, rng, lookalike_share), n))
    return out
