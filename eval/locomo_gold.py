"""LoCoMo's own annotations as gold memories, and the similarity threshold that says when a record states one.

LoCoMo's authors wrote, per session and speaker, `observation`: atomic facts each with the dialogue id
(or ids) of its evidence turn, and `event_summary`: each speaker's life events of the session, under the
session's date. Observations are gold `content` + `source_turns` + person; events are gold content +
date. Neither carries a type or the location / reason / purpose dimensions.

Similarity thresholds are fitted, never chosen by hand: an observation against the turns of its own
session, its evidence turns the positives and the rest the negatives, rendered as the rule extractor
renders a turn (`Speaker: text`); the threshold is the one of highest F1 separating them. Each
conversation is scored with the threshold fitted on the other conversations of the file
(leave-one-conversation-out), so no score is made with a threshold fitted on its own conversation. The
fit depends only on the input file, the embedder and the measures, so it is cached beside the embedder.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from dimmem.contract.conversation import Conversation, Turn
from dimmem.runtime.extractors import turn_memory
from eval.metrics import token_f1

MEASURES = ("cosine", "token_f1")  # embedding cosine (all-MiniLM-L6-v2), and the lexical one beside it
CALIBRATION_VERSION = 1  # bump when the fit's positives, negatives or rule change
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


def turn_text(turn: Turn) -> str:
    """A turn as the rule extractor states it."""
    return turn_memory(turn, turn.id)["content"]


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


# --- thresholds ------------------------------------------------------------------------------------


def best_f1_threshold(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(threshold, F1) of the cut `score >= threshold` that best separates positives from negatives."""
    order = np.argsort(-scores, kind="stable")
    ranked, hits = scores[order], labels[order].astype(bool)
    true_pos = np.cumsum(hits)
    last_of_tie = np.r_[ranked[1:] != ranked[:-1], True]  # a cut falls between distinct scores only
    chosen = np.arange(len(ranked)) + 1
    f1 = 2 * true_pos / (chosen + hits.sum())
    f1 = np.where(last_of_tie, f1, -1.0)
    best = int(np.argmax(f1))
    return float(ranked[best]), float(f1[best])


def calibration_pairs(
    conversations: list[Conversation], encode: Callable[[list[str]], np.ndarray]
) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """{conversation: {measure: (scores, labels)}} of every observation against its session's turns."""
    out = {}
    for conv in conversations:
        gold = conversation_gold(conv).observations
        by_session: dict[str, list[Turn]] = {}
        for turn in conv.turns:
            by_session.setdefault(turn.session_id, []).append(turn)
        texts = {t.id: turn_text(t) for t in conv.turns}
        turn_vectors = dict(zip(texts, encode(list(texts.values()))))
        obs_vectors = encode([g.content for g in gold])
        scores: dict[str, list[float]] = {m: [] for m in MEASURES}
        labels: list[bool] = []
        for g, vector in zip(gold, obs_vectors):
            for turn in by_session[g.session]:
                scores["cosine"].append(float(vector @ turn_vectors[turn.id]))
                scores["token_f1"].append(token_f1(g.content, texts[turn.id]))
                labels.append(turn.id in g.evidence)
        out[conv.id] = {m: (np.array(scores[m]), np.array(labels)) for m in MEASURES}
    return out


def fit_thresholds(pairs: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]) -> dict:
    """Per measure: the threshold fitted on all conversations, and each conversation's leave-one-out one."""

    def fit(measure: str, conversations: list[str]) -> tuple[float, float]:
        scores, labels = (np.concatenate([pairs[c][measure][i] for c in conversations]) for i in (0, 1))
        return best_f1_threshold(scores, labels)

    fitted: dict = {}
    for measure in MEASURES:
        threshold, f1 = fit(measure, list(pairs))
        held_out = {  # a one-conversation file can only fit on itself
            conv: fit(measure, [c for c in pairs if c != conv] or [conv])[0] for conv in pairs
        }
        fitted[measure] = {"all": threshold, "all_f1": f1, "held_out": held_out}
    return fitted


def calibrate(
    input_path: str | Path,
    conversations: list[Conversation],
    encode: Callable[[list[str]], np.ndarray],
    embedder_id: str,
    cache_dir: Path,
) -> dict:
    """The fitted thresholds for this LoCoMo file and embedder, from the cache when fitted before."""
    key = hashlib.sha256(
        Path(input_path).read_bytes() + f"\0{embedder_id}\0{CALIBRATION_VERSION}".encode()
    ).hexdigest()[:16]
    path = cache_dir / f"locomo-thresholds-{key}.json"
    if path.is_file():
        return json.loads(path.read_text())
    fitted = fit_thresholds(calibration_pairs(conversations, encode))
    fitted["fitted_on"] = "each observation against its session's turns (evidence turns positive)"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fitted, indent=2) + "\n")
    tmp.replace(path)
    return fitted
