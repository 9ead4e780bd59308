"""Annotated memories that ship with a corpus: LoCoMo's `observation` and `event_summary`.

LoCoMo's authors wrote, per session and speaker, `observation`: atomic facts each with the dialogue id
(or ids) of its evidence turn, and `event_summary`: each speaker's life events of the session, under the
session's date. Observations carry content + evidence turns + person; events carry content + date.
Neither carries a type or the location / reason / purpose dimensions: those come from
`data/locomo-dimensions.jsonl`, written by reading each annotation's evidence turns
(docs/locomo-dimensions.md), matched to an annotation by its place in the file and a hash of its
text. The extraction benchmark scores against them (eval/extraction_locomo.py) and the annotations
teacher turns them into labels (data_gen/annotations.py): one reading of the annotations serves both.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path

from dimmem.contract.conversation import Conversation

_OBSERVATION_KEY = re.compile(r"^session_(\d+)_observation$")
_EVENT_KEY = re.compile(r"^events_session_(\d+)$")
_DIA_IDS = re.compile(r"[;,\s]+")
EVENT_DATE_FORMATS = ("%d %B, %Y", "%d %b, %Y", "%d %B %Y")
DIMENSIONS_FILE = Path(__file__).parent / "data" / "locomo-dimensions.jsonl"
DIMENSION_KEYS = ("time", "location", "reason", "purpose")


@dataclass(frozen=True)
class Gold:
    """One annotated memory: an observation (with evidence turns) or an event (with the session date)."""

    id: str  # "conv-26/S1/obs/3" or "conv-26/S1/event/0"
    conversation_id: str
    session: str  # the loader's session id, "S1"
    person: str  # whom LoCoMo files it under
    content: str
    evidence: tuple[str, ...] = ()  # observations: the evidence turns' dialogue ids that exist
    speakers: frozenset[str] = (
        frozenset()
    )  # who may be the record's speaker: the person, each evidence turn's
    date: str | None = None  # events: the session date, YYYY-MM-DD
    path: tuple[str, str, int] = ("", "", 0)  # where the corpus holds it: (session key, person, index)
    dimensions: dict | None = None  # time, location, reason, purpose as read from the dialogue; None: unread


@dataclass
class ConversationGold:
    observations: list[Gold]
    events: list[Gold]
    unknown_evidence: list[str]  # evidence ids that name no turn of the conversation (kept out of pointers)


def conversation_gold(conv: Conversation) -> ConversationGold:
    turns = {t.id: t for t in conv.turns}
    read = conv.metadata.get("dimensions") or {}

    def dimensions(key: str, person: str, n: int) -> dict | None:
        found = read.get(key, {}).get(person) or []
        return found[n] if n < len(found) else None

    sessions = {sid.removeprefix("S"): sid for sid, _, _ in conv.sessions}
    observations, events, unknown = [], [], []
    for key, by_person in sorted(conv.metadata.get("observation", {}).items()):
        if not (match := _OBSERVATION_KEY.match(key)) or match[1] not in sessions:
            raise ValueError(f"{conv.id}: observation key {key!r} names no session of the conversation")
        session = sessions[match[1]]
        for person, facts in sorted(by_person.items()):
            for n, fact in enumerate(facts):
                if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str)):
                    raise ValueError(
                        f"{conv.id}: observation.{key}.{person}[{n}]: expected [fact, evidence], got {fact!r}"
                    )
                ids = fact[1] if isinstance(fact[1], list) else _DIA_IDS.split(str(fact[1]))
                ids = [str(i).strip() for i in ids if str(i).strip()]
                unknown += [f"{key}.{person}[{n}]: {i}" for i in ids if i not in turns]
                evidence = tuple(i for i in ids if i in turns)
                observations.append(
                    Gold(
                        f"{conv.id}/{session}/obs/{len(observations)}",
                        conv.id,
                        session,
                        person,
                        fact[0],
                        evidence,
                        frozenset({person, *(turns[i].speaker for i in evidence)}),
                        path=(key, person, n),
                        dimensions=dimensions(key, person, n),
                    )
                )
    for key, by_person in sorted(conv.metadata.get("event_summary", {}).items()):
        if not (match := _EVENT_KEY.match(key)) or match[1] not in sessions:
            raise ValueError(f"{conv.id}: event_summary key {key!r} names no session of the conversation")
        session, date = sessions[match[1]], _event_date(conv.id, key, by_person.get("date"))
        for person, items in sorted(by_person.items()):
            if person == "date":
                continue
            for n, content in enumerate(items):
                events.append(
                    Gold(
                        f"{conv.id}/{session}/event/{len(events)}",
                        conv.id,
                        session,
                        person,
                        content,
                        speakers=frozenset({person}),
                        date=date,
                        path=(key, person, n),
                        dimensions=dimensions(key, person, n),
                    )
                )
    return ConversationGold(observations, events, unknown)


def content_sha(text: str) -> str:
    """What ties a row of the dimensions file to an annotation without copying its text."""
    return hashlib.sha256(text.strip().encode()).hexdigest()[:12]


@cache
def _dimension_rows() -> dict[tuple[str, str, str, int], dict]:
    rows = {}
    with open(DIMENSIONS_FILE, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            rows[(row["conversation"], row["key"], row["person"], row["index"])] = row
    return rows


def with_dimensions(sample_id: str, metadata: dict) -> dict:
    """`metadata` with a `dimensions` entry shaped like its `observation` and `event_summary` ({key:
    {person: [dimensions or None]}}) for each annotation the dimensions file holds with the same text;
    shaped alike, a renamed copy renames it with them."""
    rows = _dimension_rows()
    out: dict[str, dict[str, list]] = {}
    for section in ("observation", "event_summary"):
        for key, by_person in (metadata.get(section) or {}).items():
            if not isinstance(by_person, dict):
                continue
            for person, items in by_person.items():
                if person == "date" or not isinstance(items, list):
                    continue
                found = []
                for n, item in enumerate(items):
                    text = item[0] if isinstance(item, list) and item else item
                    row = rows.get((sample_id, key, person, n))
                    ok = row is not None and isinstance(text, str) and row["content_sha"] == content_sha(text)
                    found.append({k: row[k] for k in DIMENSION_KEYS} if ok else None)
                if any(found):
                    out.setdefault(key, {})[person] = found
    return {**metadata, "dimensions": out} if out else metadata


def _event_date(conversation_id: str, key: str, raw) -> str:
    for fmt in EVENT_DATE_FORMATS:
        try:
            return datetime.strptime(str(raw).strip(), fmt).date().isoformat()
        except ValueError:
            continue
    raise ValueError(f"{conversation_id}: event_summary.{key}.date: {raw!r} is not a date like '8 May, 2023'")
