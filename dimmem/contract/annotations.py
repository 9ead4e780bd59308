"""Annotated memories that ship with a corpus: LoCoMo's `observation` and `event_summary`.

LoCoMo's authors wrote, per session and speaker, `observation`: atomic facts each with the dialogue id
(or ids) of its evidence turn, and `event_summary`: each speaker's life events of the session, under the
session's date. Observations carry content + evidence turns + person; events carry content + date.
Neither carries a type or the location / reason / purpose dimensions. The extraction benchmark scores
against them (eval/extraction_locomo.py) and the annotations teacher turns them into labels
(data_gen/annotations.py): one reading of the annotations serves both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from dimmem.contract.conversation import Conversation

_OBSERVATION_KEY = re.compile(r"^session_(\d+)_observation$")
_EVENT_KEY = re.compile(r"^events_session_(\d+)$")
_DIA_IDS = re.compile(r"[;,\s]+")
EVENT_DATE_FORMATS = ("%d %B, %Y", "%d %b, %Y", "%d %B %Y")


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


@dataclass
class ConversationGold:
    observations: list[Gold]
    events: list[Gold]
    unknown_evidence: list[str]  # evidence ids that name no turn of the conversation (kept out of pointers)


def conversation_gold(conv: Conversation) -> ConversationGold:
    turns = {t.id: t for t in conv.turns}
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
                    )
                )
    for key, by_person in sorted(conv.metadata.get("event_summary", {}).items()):
        if not (match := _EVENT_KEY.match(key)) or match[1] not in sessions:
            raise ValueError(f"{conv.id}: event_summary key {key!r} names no session of the conversation")
        session, date = sessions[match[1]], _event_date(conv.id, key, by_person.get("date"))
        for person, items in sorted(by_person.items()):
            if person == "date":
                continue
            for content in items:
                events.append(
                    Gold(
                        f"{conv.id}/{session}/event/{len(events)}",
                        conv.id,
                        session,
                        person,
                        content,
                        speakers=frozenset({person}),
                        date=date,
                    )
                )
    return ConversationGold(observations, events, unknown)


def _event_date(conversation_id: str, key: str, raw) -> str:
    for fmt in EVENT_DATE_FORMATS:
        try:
            return datetime.strptime(str(raw).strip(), fmt).date().isoformat()
        except ValueError:
            continue
    raise ValueError(f"{conversation_id}: event_summary.{key}.date: {raw!r} is not a date like '8 May, 2023'")
