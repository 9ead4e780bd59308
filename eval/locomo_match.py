"""When a record states a LoCoMo annotation, in one place: whom it is about, the one-to-one alignment,
and when a record's dimension agrees with the one read from the dialogue.

A record counts for an annotation only if it is about that annotation's person (`is_about`):

- its subject is the person: the first participant its content names (whole words, so "Maren" is not
  "Marek", and "Caroline's" names Caroline), else its speaker (a content with pronouns only);
- its speaker is the person, or, where the person speaks none of the annotation's evidence turns, the
  speaker of one of them (the contract's speaker rule: a record's speaker spoke the turns it cites).

So a record that names both people is credited to the one it names first, a fact moved onto the other
speaker is a miss for its true person, and a speaker's report of a third person's news ("Caroline's
friend Sam got married") stays with the speaker who is named first.
"""

from __future__ import annotations

import re
from datetime import timedelta

import numpy as np
from scipy.optimize import linear_sum_assignment

from dimmem.contract.annotations import Gold
from dimmem.contract.timespan import parse_span
from eval.metrics import token_f1, tokens

PHRASE_F1 = 0.5  # a location, reason or purpose agrees when its token F1 with the gold's reaches this
TIME_SLACK = timedelta(days=1)  # a date one day off ("last night" told after midnight) still agrees
_FUNCTION_WORDS = frozenset(
    ["to", "in", "at", "on", "of", "for", "and", "with", "from", "her", "his", "their", "she", "he", "they"]
)


def subject(record: dict, participants: list[str]) -> str:
    """The participant a record is about: the first one its content names, else its speaker."""
    first = None
    for name in participants:
        match = re.search(rf"\b{re.escape(name)}\b", record["content"])
        if match and (first is None or match.start() < first[0]):
            first = (match.start(), name)
    return first[1] if first else record["speaker"]


def accepted_speakers(gold: Gold, speaker_of: dict[str, str]) -> frozenset[str]:
    """Who may be the speaker of a record of `gold`: its person, or, where the person speaks none of its
    evidence turns, whoever speaks them."""
    spoken = {speaker_of[t] for t in gold.evidence if t in speaker_of}
    return frozenset({gold.person}) if gold.person in spoken or not spoken else frozenset(spoken)


def is_about(record: dict, gold: Gold, participants: list[str], speaker_of: dict[str, str]) -> bool:
    return subject(record, participants) == gold.person and record["speaker"] in accepted_speakers(
        gold, speaker_of
    )


def align(similarity: np.ndarray, eligible: np.ndarray, threshold: float) -> list[tuple[int, int, float]]:
    """(gold, record, similarity) of the one-to-one matching with the most total similarity among
    eligible pairs at or above the threshold."""
    weights = np.where(eligible & (similarity >= threshold), similarity, 0.0)
    if not weights.any():
        return []
    rows, cols = linear_sum_assignment(weights, maximize=True)
    return [(int(i), int(j), float(similarity[i, j])) for i, j in zip(rows, cols) if weights[i, j] > 0]


# --- dimensions ------------------------------------------------------------------------------------


def same_time(predicted: str, gold: str) -> bool:
    """The record's time lies within the gold's (a day of slack each side): a coarser time ("2023" for
    "2023-05-07") does not answer "when", so it does not agree."""
    try:
        start, end = parse_span(predicted)
        g_start, g_end = parse_span(gold)
    except ValueError:
        return False
    return g_start - TIME_SLACK <= start and end <= g_end + TIME_SLACK


def same_phrase(predicted: str, gold: str) -> bool:
    """A location, reason or purpose says the same: one holds the other's words, or token F1 >= PHRASE_F1."""
    a, b = tokens(predicted), tokens(gold)
    if not set(a) - _FUNCTION_WORDS or not set(b) - _FUNCTION_WORDS:
        return False
    short, long = sorted((" ".join(a), " ".join(b)), key=len)
    return f" {short} " in f" {long} " or token_f1(predicted, gold) >= PHRASE_F1


def dimension_agrees(field: str, predicted: str, gold: str) -> bool:
    return same_time(predicted, gold) if field == "time" else same_phrase(predicted, gold)
