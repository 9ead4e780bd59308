"""`dimmem datagen check-overlap`: how much of an evaluation benchmark's conversations a training set
shares, before anyone trains on it.

Three signals per evaluation conversation:
- exact: its turns whose normalized text (case, punctuation and spacing ignored) a training turn has;
- near: the other turns, most of whose word 5-grams occur in training turns (a light paraphrase);
- template: the training conversation with the most sessions of the same message count at the same gap
  from the session before (in days). A conversation generated from another as a template (new names,
  topic and dates; the same count, order and gaps) matches it although no sentence is shared.
A conversation is flagged when a tenth of its turns are shared, or when four fifths of its sessions
(three at least) match one training conversation's structure.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import datetime
from itertools import groupby
from pathlib import Path

from data_gen.jobs_index import JOBS
from data_gen.paper_dataset import load_rows, read_windows
from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.windows import job_windows

NGRAM = 5
NEAR_SHARE = 0.5  # of a turn's 5-grams found in training turns
MIN_WORDS = 4  # shorter turns ("Thanks!", "See you!") say nothing about where a conversation came from
FLAG_SHARED = 0.1
FLAG_STRUCTURE = 0.8
MIN_SESSIONS = 3
_WORD = re.compile(r"[^\W_]+")


@dataclass
class ConversationOverlap:
    conversation: str
    turns: int
    exact: int
    near: int
    sessions: int
    template: str | None  # the training conversation of most similar structure
    structure: float  # the share of this conversation's sessions that one matches
    flagged: bool


def words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def _structure(turns: list[Turn]) -> list[tuple[int, int | None]]:
    """(messages, days since the previous session's start) per session, in order."""
    out, before = [], None
    for _, group in groupby(turns, key=lambda t: t.session_id):
        group = list(group)
        start = _when(group[0].session_time)
        gap = (start - before).days if start and before else None
        out.append((len(group), gap))
        before = start
    return out


def _when(iso: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(iso) if iso else None
    except ValueError:
        return None


def train_conversations(source: str) -> dict[str, list[Turn]]:
    """Conversation -> its turns (each once, in order) from a datagen output folder (the windows in its
    jobs.jsonl, quarantined ones included) or from rows in the DimMem authors' layout (any source
    `datagen import` reads)."""
    turns: dict[str, dict[str, Turn]] = {}
    jobs = Path(source) / JOBS
    if jobs.is_file():
        windows = [window for _, window in job_windows(jobs)]
        for w in sorted(windows, key=lambda w: (w.conversation_id, w.index)):  # jobs come in any order
            turns.setdefault(w.conversation_id, {}).update((t.id, t) for t in w.turns)
    else:
        rows, _ = load_rows(source)
        reads, _ = read_windows(rows)
        for read in sorted(reads, key=lambda r: (r.conv_name, r.index)):
            if read.lines:
                turns.setdefault(read.conv_name, {}).update((t.id, t) for t in read.lines)
    return {conv: list(by_id.values()) for conv, by_id in turns.items()}


def check_overlap(train: dict[str, list[Turn]], evaluation: list[Conversation]) -> list[ConversationOverlap]:
    texts, grams = set(), set()
    for turns in train.values():
        for turn in turns:
            w = words(turn.text)
            texts.add(" ".join(w))
            grams.update(_grams(w))
    structures = {conv: _structure(turns) for conv, turns in train.items()}
    out = []
    for conv in evaluation:
        exact = near = 0
        for turn in conv.turns:
            w = words(turn.text)
            if len(w) < MIN_WORDS:
                continue
            if " ".join(w) in texts:
                exact += 1
            elif (g := _grams(w)) and sum(x in grams for x in g) >= NEAR_SHARE * len(g):
                near += 1
        mine = _structure(conv.turns)
        template, structure = _closest(mine, structures)
        shared = (exact + near) / max(len(conv.turns), 1)
        flagged = shared >= FLAG_SHARED or (len(mine) >= MIN_SESSIONS and structure >= FLAG_STRUCTURE)
        out.append(
            ConversationOverlap(
                conv.id, len(conv.turns), exact, near, len(mine), template, round(structure, 3), flagged
            )
        )
    return out


def _grams(w: list[str]) -> set[int]:
    return {hash(tuple(w[i : i + NGRAM])) for i in range(len(w) - NGRAM + 1)}


def _closest(mine: list[tuple], structures: dict[str, list[tuple]]) -> tuple[str | None, float]:
    """The training conversation whose sessions match most of `mine` position by position (message
    count, and the gap in days where both know it)."""
    best, score = None, 0.0
    for conv, theirs in structures.items():
        same = sum(
            a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1]) for a, b in zip(mine, theirs)
        )
        share = same / max(len(mine), len(theirs), 1)
        if share > score:
            best, score = conv, share
    return best, score


def format_report(rows: list[ConversationOverlap]) -> str:
    lines = [
        "| evaluation conversation | turns | exact | near | shared | sessions | closest template | structure "
        "| flagged |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shared = (r.exact + r.near) / max(r.turns, 1)
        lines.append(
            f"| {r.conversation} | {r.turns} | {r.exact} | {r.near} | {shared:.1%} | {r.sessions} "
            f"| {r.template or '-'} | {r.structure:.2f} | {'yes' if r.flagged else 'no'} |"
        )
    flagged = sum(r.flagged for r in rows)
    lines.append(f"\n{flagged} of {len(rows)} evaluation conversations flagged.")
    return "\n".join(lines)


def as_json(rows: list[ConversationOverlap], train: str, evaluation: str) -> dict:
    return {
        "train": train,
        "eval": evaluation,
        "thresholds": {"shared": FLAG_SHARED, "structure": FLAG_STRUCTURE, "min_sessions": MIN_SESSIONS},
        "flagged": [r.conversation for r in rows if r.flagged],
        "conversations": [asdict(r) for r in rows],
    }
