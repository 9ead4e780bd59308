"""Consolidation of a new record with its closest stored candidate: MERGE, SUPERSEDE or KEEP_BOTH
(a `consolidate` answer), decided by rules or by a model with the rules as fallback."""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import datetime

from dimmem.contract.prompts import consolidate_messages
from dimmem.contract.records import MEMORY_FIELDS
from dimmem.contract.timespan import parse_span
from dimmem.contract.validate import TurnScope, validate
from dimmem.llm import ModelClient, ModelError
from dimmem.runtime.query import content_words


class RuleConsolidator:
    """The decisions no model takes: precise, so they join few (its candidate: the same speaker and type,
    the closest from `update.similarity_threshold`). Two kinds of pair are joined:

    - a changed dimension: fact or profile records with the same keywords once the speaker's name and
      the places are set aside, that name two places: where something is has changed, and the later
      record holds (SUPERSEDE; `recency` says which is later);
    - a restatement: from `restate_similarity` on, with most of the shorter record's content words
      (`restate_overlap`) in the other: one record says it (MERGE). Events merge only when they agree on
      time and place; two occasions stay two records.
    - a changed attribute (`changed`): a later telling of where the speaker lives that names another
      place, or of a new job, replaces the earlier one whatever words either uses (SUPERSEDE);
    Anything else is kept apart (KEEP_BOTH): close texts about one topic are usually two facts."""

    def __init__(self, restate_similarity: float, restate_overlap: float):
        self.restate_similarity, self.restate_overlap = restate_similarity, restate_overlap

    def __call__(self, new: dict, candidate: dict, similarity: float) -> dict:
        if changed(new, candidate) or new["type"] in ("fact", "profile") and moved(new, candidate):
            return {"action": "SUPERSEDE", "memory": {k: new[k] for k in MEMORY_FIELDS}}
        if similarity < self.restate_similarity:
            return KEEP_BOTH
        if word_overlap(new["content"], candidate["content"]) < self.restate_overlap:
            return KEEP_BOTH
        places = {r.get("location") for r in (new, candidate)} - {None}
        if new["type"] == "episodic" and (new.get("time") != candidate.get("time") or len(places) > 1):
            return KEEP_BOTH
        return {"action": "MERGE", "memory": merge(new, candidate)}


KEEP_BOTH = {"action": "KEEP_BOTH", "memory": None}


def moved(a: dict, b: dict) -> bool:
    """The same thing in two places: both records name a place, not the same one, and their keywords are
    the same once the speaker's name and the places are set aside, one at least ("home"; "Maya",
    "engineer"). Another keyword ("Rosa, nurse" / "Nora, nurse") is another thing."""
    if not a.get("location") or not b.get("location"):
        return False
    if a["location"].casefold() == b["location"].casefold():
        return False
    ignore = {a["speaker"].casefold(), a["location"].casefold(), b["location"].casefold()}
    rest = [{k.casefold() for k in r["keywords"]} - ignore for r in (a, b)]
    return bool(rest[0]) and rest[0] == rest[1]


# A person's attribute that a later telling replaces, whatever words it uses (the dimension-aware update):
# where they live, told with its place, and their job, told as a change. Each is matched only right after
# the speaker's name (adverbs between), so "Ann's parents live in Lisbon" is not Ann's home, and never in
# the past tense of a state ("Ann lived in Paris as a kid" is history, not a move).
_ADVERBS = r"(?:\s+(?:now|recently|just|finally|also|currently|still|has|have|had|officially))*"
_HOME = re.compile(
    r"\s+(?:lives|is living|moved|relocated|settled|is based|resides|is now based)\s+(?:back\s+)?(?:in|to)\s+"
    r"(?:the\s+)?(?P<place>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)"
)
_OWN_HOME = re.compile(  # "Ann's home is a flat in Leeds"
    r"'s\s+(?:home|house|flat|apartment)\s+is\b[^.;]*?\b(?:in|at)\s+(?P<place>[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*)"
)
_JOB_CHANGE = re.compile(
    r"\s+(?:(?:(?:got|landed|took|accepted|started|began)\s+)?(?:a\s+)?new\s+(?:job|position|role)"
    r"|(?:started|began)\s+(?:working|a\s+job|a\s+new\s+job)\s+(?:at|as|for)"
    r"|(?:was|got|has\s+been)\s+hired|switched\s+(?:jobs|careers)|changed\s+(?:jobs|careers)"
    r"|quit\s+(?:his|her|their)\s+job|left\s+(?:his|her|their)\s+job)\b"
)
_JOB_STATE = re.compile(r"\s+(?:works|is\s+working)\s+(?:as|at|for)\b")


def slot(record: dict) -> tuple[str, str] | None:
    """(attribute, value) of what a record says about its speaker: ("home", the place) or ("job", "new"
    when it tells a change, else ""); None when it says neither."""
    name = re.escape(record["speaker"])
    content = record["content"]
    for match in re.finditer(rf"\b{name}\b", content):
        if home := _OWN_HOME.match(content[match.end() :]):
            return "home", (record.get("location") or home["place"]).casefold()
    for match in re.finditer(rf"\b{name}\b(?!'s){_ADVERBS}", content):
        rest = content[match.end() :]
        if home := _HOME.match(rest):
            return "home", (record.get("location") or home["place"]).casefold()
        if _JOB_CHANGE.match(rest):
            return "job", "new"
        if _JOB_STATE.match(rest):
            return "job", ""
    return None


def changed(new: dict, old: dict) -> bool:
    """The newer telling replaces the older: the same speaker's home in another place, or a new job
    after any telling of their job."""
    if new["speaker"].casefold() != old["speaker"].casefold():
        return False
    a, b = slot(new), slot(old)
    if a is None or b is None or a[0] != b[0]:
        return False
    later, earlier = (a, b) if recency(new) > recency(old) else (b, a)
    return later[1] == "new" if later[0] == "job" else later[1] != earlier[1]


def word_overlap(a: str, b: str) -> float:
    """The share of the shorter text's content words that the other has (1.0: it says nothing new)."""
    x, y = ({w.casefold() for w in content_words(text)} for text in (a, b))
    return len(x & y) / min(len(x), len(y)) if x and y else 0.0


def merge(a: dict, b: dict) -> dict:
    """One record of two that say the same: the later one's fields (`recency`), its blanks filled from the
    other, the longer content, both keywords and source turns. The same whichever arrived first."""
    later, earlier = (a, b) if recency(a) > recency(b) else (b, a)
    merged = {k: later[k] if later.get(k) is not None else earlier.get(k) for k in MEMORY_FIELDS}
    merged["content"] = max((later["content"], earlier["content"]), key=lambda text: (len(text), text))
    merged["keywords"] = list(dict.fromkeys(later["keywords"] + earlier["keywords"]))
    merged["source_turns"] = list(dict.fromkeys(earlier["source_turns"] + later["source_turns"]))
    return merged


def recency(record: dict) -> tuple:
    """What orders two records in time: (when it was told, when it happened, session time, id in natural
    order). Told: its session's date, else the moment it was stored (now, for a record being added);
    happened: the start of its event time. The later telling holds (a person who says where they live
    now is believed over what they said before, whatever dates either names); within one telling, the
    later event. ISO strings throughout, so a date and a moment compare as text."""
    session = record.get("session_time") or ""
    told = session[:10] or datetime.fromtimestamp(record.get("created") or time.time()).isoformat()
    happened = ""
    if record.get("time"):
        try:
            happened = parse_span(record["time"])[0].isoformat()
        except ValueError:  # the validator lets only spans through; a hand-made time may be anything
            happened = ""
    order = [int(p) if p.isdigit() else p for p in _DIGITS.split(record.get("id") or "")]
    return told, happened, session, order


_DIGITS = re.compile(r"(\d+)")


def decision_scope(new: dict, candidate: dict) -> TurnScope:
    """The turns a decision's memory may cite: those of the two records."""
    return TurnScope(
        {
            **{t: candidate["speaker"] for t in candidate["source_turns"]},
            **{t: new["speaker"] for t in new["source_turns"]},
        },
        frozenset(candidate["source_turns"]) | frozenset(new["source_turns"]),
    )


class ModelConsolidator:
    """Asks the model; an unavailable endpoint or an invalid decision falls back to the rules."""

    def __init__(self, client: ModelClient, rules: RuleConsolidator):
        self.client, self.rules, self.stats = client, rules, Counter()

    def __call__(self, new: dict, candidate: dict, similarity: float) -> dict:
        messages = consolidate_messages(
            {k: new[k] for k in MEMORY_FIELDS},
            {k: candidate[k] for k in MEMORY_FIELDS},
            new.get("session_time"),
            candidate.get("session_time"),
        )
        try:
            decision = self.client.json("consolidate", messages)
            if validate("consolidate", decision, decision_scope(new, candidate)).ok:
                self.stats["model"] += 1
                return decision
            self.stats["invalid"] += 1
        except ModelError:
            self.stats["unavailable"] += 1
        return self.rules(new, candidate, similarity)
