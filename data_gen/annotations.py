"""The annotations teacher: a corpus's own annotations (LoCoMo's observations and events) as DimMem labels
for the pipeline's windows, answered through the same labeler, validator, cache and quarantine as a model.

Each annotation becomes one record by these rules (docs/datagen.md, "Annotations as a teacher"):

- placement: an observation is told by its person where the person speaks an evidence turn (else by
  the speaker of its first one); it goes to the window whose new turns hold that speaker's first evidence
  turn and cites that speaker's evidence turns new there (served, a record cites its speaker's turns
  only: the window's schema says so); an event (no evidence in the corpus) goes to the turn of its person in
  its session that shares the most words with it (token F1 at least `EVENT_MIN_F1`), unless an
  observation of the same person and session already restates it (token F1 at least `RESTATED_F1`);
- speaker: the speaker of the cited turns (the contract's speaker rule);
- time, location, reason, purpose: as read from the dialogue (`Gold.dimensions`, the corpus's reading
  shipped with the contract: docs/locomo-dimensions.md). An annotation nobody read gets them by rule:
  the first time expression of its text, else (for an event) of its cited turns, resolved against the
  session date by `dateparser` at the expression's own grain (a day, a week as an interval, a month, a
  year), never the session date by default (a fact is not dated by when it was told); the phrase after an
  explicit marker ("at", "in", "visited" + a name; "because", "due to"; "in order to", "so that", "to
  help ...") for the others;
- content: the annotation's text with its time expression replaced by the date the record's time says
  ("last year" -> "in 2022"; a vague "recently" too, where the dialogue gave the date), so the content
  is self-contained;
- type: episodic when dated or stated as an event, profile for preferences and traits, else fact;
- keywords: the person and up to four key phrases of the content (YAKE), without repeats.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import cache

from dimmem.cache import Completion
from dimmem.contract.annotations import Gold, conversation_gold
from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.records import DIMENSIONS, canonical_json
from dimmem.llm import Usage

EVENT_MIN_F1 = 0.2  # an event is placed at a turn that shares at least this much with it
RESTATED_F1 = 0.4  # an event that an observation states this closely is that observation
MAX_KEYWORDS = 5

_WEEKDAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
_MONTH = (
    r"(?:january|february|march|april|may|june|july|august|september|october|november|december|"
    r"jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec)"
)
_COUNT = r"(?:\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a couple of)"
# (pattern, grain) in the order they are tried; the first match in the text wins
TIME_PATTERNS: list[tuple[re.Pattern, str]] = [
    (re.compile(rf"\b(?:on |in )?{_MONTH} \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b", re.I), "day"),
    (re.compile(rf"\b(?:on )?\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTH},? \d{{4}}\b", re.I), "day"),
    (
        re.compile(
            r"\b(?:yesterday|today|tonight|tomorrow|last night|this (?:morning|afternoon|evening))\b", re.I
        ),
        "day",
    ),
    (re.compile(rf"\b(?:last|this past|next|this|on) {_WEEKDAY}\b", re.I), "day"),
    (re.compile(rf"\b{_COUNT} days? (?:ago|from now)\b", re.I), "day"),
    (re.compile(r"\b(?:last|next|this|the past) weekend\b", re.I), "weekend"),
    (re.compile(r"\b(?:last|next|this|the past) week\b", re.I), "week"),
    (re.compile(rf"\b{_COUNT} weeks? (?:ago|from now)\b", re.I), "week"),
    (re.compile(rf"\b(?:in )?{_MONTH},? \d{{4}}\b", re.I), "month"),
    (re.compile(r"\b(?:last|next|this|the past) month\b", re.I), "month"),
    (re.compile(rf"\b{_COUNT} months? (?:ago|from now)\b", re.I), "month"),
    (re.compile(r"\b(?:last|next|this|the past) year\b", re.I), "year"),
    (re.compile(rf"\b{_COUNT} years? (?:ago|from now)\b", re.I), "year"),
    (re.compile(r"\b(?:in|since|during) (?:19|20)\d{2}\b", re.I), "year"),
]
_VAGUE = re.compile(r"\b(?:recently|lately|just now)\b", re.I)

_PROFILE = re.compile(
    r"\b(?:likes?|loves?|enjoys?|prefers?|favou?rite|passionate|values?|hates?|dislikes?|fan of|"
    r"allergic|identif(?:y|ies) as|is (?:a|an) [\w-]+ person|personality|habit|usually|always|often|"
    r"dreams? (?:of|to)|believes?|cares? about|interested in|afraid of|fears?)\b",
    re.I,
)
_EVENT = re.compile(
    r"\b(?:went|attended|attends?|visited|visits?|took|takes|started|starts|joined|joins|finished|"
    r"finishes|bought|buys|met|meets|won|wins|lost|moved|moves|adopted|ran|participated|organized|"
    r"celebrated|traveled|travelled|received|got|gets|had a|made|painted|wrote|tried|signed up|"
    r"volunteered|is planning|plans to|planned|will|is going to|hosted|performed|graduated|launched)\b",
    re.I,
)
_LOCATION = re.compile(
    r"\b(?:at|in|to|from|near|visited|visiting|visit) (?:the )?"
    r"((?:[A-Z][\w'&-]*)(?: (?:[A-Z][\w'&-]*|of|de))*)(?: (\w+))?"
)
# words that may follow a place name; any other lowercase word makes it a modifier ("the LGBTQ community")
_AFTER_PLACE = frozenset(
    re.findall(
        r"\w+",
        "and or but with for to on in at from after before when where while because since as last next this "
        "that recently yesterday a an the of during every each one two three four five six seven eight nine "
        "ten years months weeks days is was were are has had have",
    )
)
_REASON = re.compile(r"\b(?:because(?: of)?|due to|as a result of|thanks to) ([^,.;]+)", re.I)
_PURPOSE = re.compile(
    r"\b(?:in order to|so that|so as to|for the purpose of|to(?= (?:help|support|raise|promote|improve|"
    r"celebrate|honou?r|show|learn|build|find|make|give|share|spread|connect|relieve|cope|stay)\b))"
    r" ([^,.;]+)",
    re.I,
)
_NOT_PLACES = re.compile(rf"^(?:{_MONTH}|{_WEEKDAY}|I|The|A|An)$", re.I)


@dataclass(frozen=True)
class Placed:
    """An annotation placed at a turn: what it is, the turn whose window it belongs to, the turns it cites
    (global ids)."""

    gold: Gold
    kind: str  # "observation" | "event"
    anchor: str  # the turn whose window it belongs to
    cites: tuple[str, ...]


# --- time ------------------------------------------------------------------------------------------


def find_time(text: str, base: date) -> tuple[str, str, str] | None:
    """(ISO time, the expression, the phrase that replaces it) of the first expression of `text` that
    `dateparser` resolves against `base`, or None."""
    found = sorted(
        ((m.start(), m.group(0), grain) for pattern, grain in TIME_PATTERNS for m in pattern.finditer(text)),
        key=lambda hit: hit[0],
    )
    for _, expression, grain in found:
        resolved = _resolve(expression, grain, base)
        if resolved:
            return resolved[0], expression, resolved[1]
    return None


def _resolve(expression: str, grain: str, base: date) -> tuple[str, str] | None:
    import dateparser

    words = re.sub(r"^(?:on|in|since|during) ", "", expression.strip(), flags=re.I)
    words = re.sub(r"\b(?:this past|the past)\b", "last", words, flags=re.I)
    future = bool(re.search(r"\b(?:next|tomorrow|from now)\b", words, re.I))
    anchor = datetime(base.year, base.month, base.day, 12)
    if grain == "weekend":  # dateparser has no weekend: the Saturday and Sunday of that week
        shift = {"last": -7, "next": 7}.get(words.split()[0].lower(), 0)
        saturday = base + timedelta(days=5 - base.weekday() + shift)
        span = f"{saturday.isoformat()}/{(saturday + timedelta(days=1)).isoformat()}"
        return span, f"on the weekend of {saturday.isoformat()}"
    parsed = dateparser.parse(
        words,
        languages=["en"],
        settings={
            "RELATIVE_BASE": anchor,
            "PREFER_DATES_FROM": "future" if future else "past",
            "RETURN_AS_TIMEZONE_AWARE": False,
        },
    )
    if parsed is None:
        return None
    day = parsed.date()
    if grain == "day":
        return day.isoformat(), f"on {day.isoformat()}"
    if grain == "week":
        monday = day - timedelta(days=day.weekday())
        sunday = monday + timedelta(days=6)
        return f"{monday.isoformat()}/{sunday.isoformat()}", f"in the week of {monday.isoformat()}"
    if grain == "month":
        return f"{day:%Y-%m}", f"in {day:%B %Y}"
    return f"{day:%Y}", f"in {day:%Y}"


def _replace(text: str, expression: str, phrase: str) -> str:
    return re.sub(rf"(?:\b(?:on|in|during) )?{re.escape(expression)}", phrase, text, count=1)


def phrase_of(time: str) -> str:
    """How a content says an ISO time: "on 2023-05-07", "in May 2023", "in 2022", "in the week of
    2023-05-01", "on the weekend of 2023-05-06", "between June 2023 and August 2023"."""
    first, _, last = time.partition("/")

    def one(part: str) -> str:
        return datetime.strptime(part, "%Y-%m").strftime("%B %Y") if len(part) == 7 else part

    if not last:
        return f"on {first}" if len(first) == 10 else f"in {one(first)}"
    if len(first) == len(last) == 10:
        start, end = date.fromisoformat(first), date.fromisoformat(last)
        if start.weekday() == 5 and end - start == timedelta(days=1):
            return f"on the weekend of {first}"
        if start.weekday() == 0 and end - start == timedelta(days=6):
            return f"in the week of {first}"
    return f"between {one(first)} and {one(last)}"


# --- the other dimensions ----------------------------------------------------------------------------


def record_type(content: str, dated: bool) -> str:
    if dated:
        return "episodic"
    if _PROFILE.search(content):
        return "profile"
    return "episodic" if _EVENT.search(content) else "fact"


def location_of(content: str, people: set[str]) -> str | None:
    for match in _LOCATION.finditer(content):
        place, after = match.group(1).strip(), match.group(2)
        if place in people or _NOT_PLACES.match(place) or place.split()[0] in people:
            continue
        if after and after.islower() and after not in _AFTER_PLACE:
            continue
        return place
    return None


def _clause(pattern: re.Pattern, content: str) -> str | None:
    match = pattern.search(content)
    if not match:
        return None
    clause = match.group(1).strip()
    return clause if len(clause.split()) <= 16 else None


@cache
def _keyword_extractor():
    import yake

    return yake.KeywordExtractor(lan="en", n=2, dedupLim=0.6, top=15)


_FILLER = frozenset(["back", "just", "also", "really", "very", "currently", "still", "soon", "together"])


def _names_a_thing(phrase: str) -> bool:
    """No verb or adverb among the words (YAKE's n-grams cut across clauses: "recently started")."""
    return not any(
        w.endswith("ly")
        or (len(w) > 4 and w.endswith("ed"))
        or w in _FILLER
        or _EVENT.fullmatch(w)
        or _PROFILE.fullmatch(w)
        for w in _words(phrase)
    )


def keywords_of(content: str, person: str, people: set[str], extra: tuple[str, ...] = ()) -> list[str]:
    """The person, the other participants the content names, any given anchors (a place), then YAKE's
    best phrases that name no participant and hold no phrase already kept."""
    names = {n.casefold() for n in people}
    named = [n for n in sorted(people) if n != person and re.search(rf"\b{re.escape(n)}\b", content)]
    phrases = [k for k, _ in _keyword_extractor().extract_keywords(content)]
    kept: list[str] = [person, *named]
    for phrase in [*extra, *phrases]:
        phrase = phrase.strip(" .,'\"")
        folded = phrase.casefold()
        if not phrase or set(_words(phrase)) & names or not _names_a_thing(phrase):
            continue
        if any(folded in k.casefold() or k.casefold() in folded for k in kept):
            continue
        kept.append(phrase)
    return kept[:MAX_KEYWORDS]


# --- the teacher -------------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def token_overlap(a: str, b: str) -> float:
    """Token F1 of two texts (SQuAD-style, without stop-word removal)."""
    x, y = _words(a), _words(b)
    common = sum((Counter(x) & Counter(y)).values())
    return 0.0 if not common else 2 * common / (len(x) + len(y))


def place(conv: Conversation) -> tuple[list[Placed], Counter]:
    """Every annotation of `conv` placed at a turn, in turn order, and the counts of what was not."""
    gold = conversation_gold(conv)
    order = {t.id: i for i, t in enumerate(conv.turns)}
    by_session: dict[str, list[Turn]] = {}
    for turn in conv.turns:
        by_session.setdefault(turn.session_id, []).append(turn)
    placed: list[Placed] = []
    missed: Counter = Counter()
    speaker_of = {t.id: t.speaker for t in conv.turns}
    for g in gold.observations:
        if not g.evidence:
            missed["observation_no_evidence_turn"] += 1
            continue
        cites = sorted(g.evidence, key=order.__getitem__)
        teller = g.person if any(speaker_of[t] == g.person for t in cites) else speaker_of[cites[0]]
        told = tuple(t for t in cites if speaker_of[t] == teller)
        placed.append(Placed(g, "observation", told[0], told))
    for g in gold.events:
        same = [o for o in gold.observations if o.session == g.session and o.person == g.person]
        if any(token_overlap(g.content, o.content) >= RESTATED_F1 for o in same):
            missed["event_restates_an_observation"] += 1
            continue
        turns = [t for t in by_session.get(g.session, []) if t.speaker == g.person]
        scored = [(token_overlap(g.content, t.text), -order[t.id], t) for t in turns]
        best = max(scored, default=None, key=lambda s: s[:2])
        if best is None or best[0] < EVENT_MIN_F1:
            missed["event_no_matching_turn"] += 1
            continue
        placed.append(Placed(g, "event", best[2].id, (best[2].id,)))
    placed.sort(key=lambda p: (order[p.anchor], p.kind != "observation"))
    return placed, missed


def record_of(p: Placed, turns: dict[str, Turn], people: set[str]) -> dict:
    """The DimMem record an annotation becomes (global turn ids; the window maps them to local ones)."""
    cited = [turns[t] for t in p.cites]
    session_day = date.fromisoformat(cited[0].session_time[:10])
    content = p.gold.content.strip()
    read = p.gold.dimensions
    dims = dict(read) if read is not None else _rule_dimensions(p, cited, session_day, people)
    found = find_time(content, session_day)
    if dims["time"] and found:  # the content says when in the words the record's time resolves
        content = _replace(content, found[1], phrase_of(dims["time"]))
    elif dims["time"] and _VAGUE.search(content):
        content = _VAGUE.sub(phrase_of(dims["time"]), content, count=1)
    location = dims["location"]
    return {
        "source_turns": list(p.cites),
        "speaker": cited[0].speaker,
        "content": content,
        "type": record_type(content, dims["time"] is not None),
        "time": dims["time"],
        "location": location,
        "reason": dims["reason"],
        "purpose": dims["purpose"],
        "keywords": keywords_of(content, p.gold.person, people, (location,) if location else ()),
    }


def _rule_dimensions(p: Placed, cited: list[Turn], session_day: date, people: set[str]) -> dict:
    """The dimensions of an annotation nobody read, by rule (the module's docstring)."""
    content, time = p.gold.content.strip(), None
    if found := find_time(content, session_day):
        time = found[0]
        content = _replace(content, found[1], found[2])
    elif _EVENT.search(content):  # an event is dated by its turn; a fact is not dated by when it was told
        time = next((f[0] for turn in cited if (f := find_time(turn.text, session_day))), None)
    return {
        "time": time,
        "location": location_of(content, people),
        "reason": _clause(_REASON, content),
        "purpose": _clause(_PURPOSE, content),
    }


class AnnotationTeacher:
    """Answers each extract job with the window's annotations as records (`Placed`, `record_of`)."""

    model = "annotations"

    def __init__(self, conversations: list[Conversation]):
        self.usage = Usage()
        self.by_conversation: dict[str, list[tuple[Placed, dict]]] = {}
        self.missed: Counter = Counter()
        self.totals: Counter = Counter()
        for conv in conversations:
            turns = {t.id: t for t in conv.turns}
            placed, missed = place(conv)
            people = set(conv.speakers)
            self.by_conversation[conv.id] = [(p, record_of(p, turns, people)) for p in placed]
            self.missed += missed
            gold = conversation_gold(conv)
            self.totals.update(observations=len(gold.observations), events=len(gold.events))

    async def answer(self, job, messages: list[dict], salt: int) -> Completion:
        if job.task != "extract":
            raise ValueError(f"the annotations teacher answers extract jobs only, not {job.task!r}")
        return Completion(canonical_json("extract", {"memories": self.memories(job.window)}), "stop")

    def memories(self, window) -> list[dict]:
        local = dict(zip((t.id for t in window.turns), window.local_ids))
        new = {t.id for t in window.new}
        return [
            {**record, "source_turns": [local[t] for t in record["source_turns"] if t in new]}
            for p, record in self.by_conversation.get(window.conversation_id, [])
            if p.anchor in new
        ]

    def coverage(self, outcomes) -> dict:
        """What became of the annotations: placed, kept in labeled windows, quarantined (by reason), and
        the share of the records with each dimension filled."""
        placed = Counter(p.kind for rows in self.by_conversation.values() for p, _ in rows)
        kept, lost = Counter(), Counter()
        for o in outcomes:
            if o.job.task != "extract":
                continue
            new = {t.id for t in o.job.window.new}
            here = Counter(
                p.kind for p, _ in self.by_conversation.get(o.job.conversation_id, []) if p.anchor in new
            )
            if o.status == "quarantined":
                lost.update({f"{kind}: {(o.reason or '').splitlines()[0]}": n for kind, n in here.items()})
            else:
                kept += here
        records = [r for rows in self.by_conversation.values() for _, r in rows]
        share = {"time": sum(r["time"] is not None for r in records) / len(records) if records else 0.0}
        share |= {
            d: sum(r[d] is not None for r in records) / len(records) if records else 0.0 for d in DIMENSIONS
        }
        out = {}
        for kind, total in (("observation", self.totals["observations"]), ("event", self.totals["events"])):
            out[f"{kind}s"] = total
            out[f"{kind}s_placed"] = placed[kind]
            out[f"{kind}s_kept"] = kept[kind]
            out[f"{kind}_share_placed"] = round(placed[kind] / total, 4) if total else None
            out[f"{kind}_share_kept"] = round(kept[kind] / total, 4) if total else None
        out["not_placed"] = dict(sorted(self.missed.items()))
        out["quarantined"] = dict(sorted(lost.items()))
        out["records"] = len(records)
        out["dimension_filled"] = {k: round(v, 4) for k, v in share.items()}
        out["types"] = dict(Counter(r["type"] for r in records))
        return out
