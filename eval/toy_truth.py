"""The toy world's ground truth for the retrieval benchmark: its records as the runtime stores them
(`truth_records`), and retrieval questions over a dialogue with known evidence (the conversation turns of the
ground-truth records that answer them), in classes that exercise each dimension:

- `time`: "What did Bob do on May 7, 2023?", or "... yesterday?" / "last week" / "last month" with a
  reference date that makes the relative phrase mean the record's time. The question names the person
  but not the event: the same person's other events and the other person's events are the distractors.
- `location`: "What did Bob do at the harbor?", "Who in Bob's family works in Kyoto?"
- `update`: "Where does Bob live now?" for a person who moved: the current home must outrank the ones
  it replaced (`current`, `stale`).
- `profile`: preferences asked in other words ("Is Bob an early riser?" for "a morning person").
- `content`: plain questions with no time, place or type cue ("When did Bob get a dog?").

Evidence is every fact of the person that answers the question (all of Bob's events overlapping the
asked time, all of his hikes), each fact found when a retrieved record cites the turn that completes a
statement of it (a preference told twice is one fact: after consolidation one record holds it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from dimmem.contract.records import DIMENSIONS
from dimmem.contract.timespan import overlaps, parse_span
from dimmem.contract.toyworld import AssistantChat, ToyDialogue, TruthRecord

CLASSES = ("time", "location", "update", "profile", "content")

PROFILE_QUESTIONS = {  # the preference's first keyword -> questions that do not repeat its words
    "jazz": ["What music does {name} listen to?", "What kind of music is {name} into?"],
    "peanut allergy": ["Does {name} have any food allergies?", "What does {name} have to avoid eating?"],
    "tea": ["What does {name} prefer to drink?", "Is {name} more of a tea or a coffee drinker?"],
    "morning person": ["Is {name} an early riser?", "What time does {name} usually get up?"],
    "horror movies": ["What kind of films does {name} dislike?", "Which movies does {name} avoid?"],
    "spicy ramen": ["What is {name}'s favorite dish?", "What does {name} love to eat most?"],
}
EVENT_QUESTIONS = {  # the event's keyword -> "when" questions, some in other words
    "hiking": ["When did {name} go hiking?", "When was {name} last out on a hike?"],
    "art museum": ["When did {name} go to the art museum?", "When did {name} see an exhibition?"],
    "charity race": ["When did {name} run the charity race?", "When did {name} race for charity?"],
    "pottery class": ["When did {name} start pottery?", "When did {name} take up ceramics?"],
    "puppy": ["When did {name} adopt a puppy?", "When did {name} get a dog?"],
    "camping": ["When did {name} go camping?", "When did {name} sleep in a tent outdoors?"],
    "baking": ["When did {name} bake bread?", "When did {name} make a loaf?"],
    "concert": ["When did {name} go to a concert?", "When did {name} see live music?"],
}
HOME_NOW = [
    "Where does {name} live now?",
    "Which city is {name} based in these days?",
    "Where is {name} living at the moment?",
    "What is {name}'s current home city?",
]
TIME_ABSOLUTE = [
    "What did {name} do {when}?",
    "What was {name} up to {when}?",
    "What happened with {name} {when}?",
]
TIME_RELATIVE = {"day": "yesterday", "week": "last week", "month": "last month"}


@dataclass(frozen=True)
class Question:
    id: str
    conversation_id: str
    kind: str  # one of CLASSES
    question: str
    reference_date: str  # ISO date the question is asked on
    facts: tuple[frozenset[str], ...]  # per fact that answers it, the turns completing a statement of it
    current: str | None = None  # update questions: the turn that states the current value
    stale: frozenset[str] = frozenset()  # update questions: the turns of the values it replaced

    @property
    def evidence(self) -> frozenset[str]:
        return frozenset().union(*self.facts)


def _granularity(value: str) -> str:
    if "/" in value:
        return "week"
    return {7: "month", 10: "day"}.get(len(value), "year")


def _when(value: str) -> str:
    """A record time as a question states it: 'on May 7, 2023', 'in June 2023', 'in the week of ...'."""
    start, _ = parse_span(value)
    kind = _granularity(value)
    if kind == "month":
        return f"in {start:%B %Y}"
    day = f"{start:%B} {start.day}, {start.year}"
    return f"in the week of {day}" if kind == "week" else f"on {day}"


def _relative_reference(value: str, rng: random.Random) -> date:
    """A day on which 'yesterday' / 'last week' / 'last month' means exactly this record time."""
    start, end = parse_span(value)
    kind = _granularity(value)
    if kind == "day":
        return start + timedelta(days=1)
    if kind == "week":  # the record's week runs Monday to Sunday: any day of the next week
        return end + timedelta(days=1 + rng.randrange(7))
    return end + timedelta(days=1 + rng.randrange(25))


def _turns(records: list[TruthRecord]) -> frozenset[str]:
    return frozenset(t for r in records for t in r.source_turns)


def _facts(records: list[TruthRecord]) -> tuple[frozenset[str], ...]:
    """Per distinct fact, the turns that complete a statement of it (each record's last source turn: for
    "My sister Nora visited" + "She works as a nurse in Kyoto", the second). A preference said twice is
    one fact, found by either statement."""
    by_content: dict[str, set[str]] = {}
    for r in records:
        by_content.setdefault(r.content, set()).add(r.source_turns[-1])
    return tuple(frozenset(turns) for turns in by_content.values())


def _home_chains(records: list[TruthRecord]) -> list[list[TruthRecord]]:
    """Each person's home records, oldest first (each next one supersedes the one before)."""
    by_id = {r.id: r for r in records}
    replaced = {r.supersedes for r in records if r.supersedes}
    chains = []
    for last in (r for r in records if "home" in r.keywords and r.id not in replaced):
        chain = [last]
        while chain[0].supersedes:
            chain.insert(0, by_id[chain[0].supersedes])
        chains.append(chain)
    return chains


def dialogue_questions(dialogue: ToyDialogue, seed: int, per_class: int) -> list[Question]:
    """Up to `per_class` questions of each class about one dialogue (seeded: the same world and seed give
    the same questions)."""
    conv = dialogue.conversation
    rng = random.Random(f"{seed}:{conv.id}:retrieval")
    records = dialogue.records
    last_day = datetime.fromisoformat(conv.turns[-1].session_time).date().isoformat()
    candidates: dict[str, list[Question]] = {kind: [] for kind in CLASSES}

    def add(kind: str, question: str, evidence: list[TruthRecord], reference: str = last_day, **extra):
        qid = f"{conv.id}#{kind}{len(candidates[kind]) + 1}"
        candidates[kind].append(Question(qid, conv.id, kind, question, reference, _facts(evidence), **extra))

    def of(name: str, kind: str | None = None) -> list[TruthRecord]:
        return [r for r in records if r.speaker == name and (kind is None or r.type == kind)]

    for rec in records:
        name = rec.speaker
        if rec.type == "episodic" and rec.time:
            span = parse_span(rec.time)
            evidence = [r for r in of(name, "episodic") if r.time and overlaps(parse_span(r.time), span)]
            granularity = _granularity(rec.time)
            if granularity in TIME_RELATIVE and rng.random() < 0.5:
                reference = _relative_reference(rec.time, rng).isoformat()
                add(
                    "time",
                    rng.choice(TIME_ABSOLUTE).format(name=name, when=TIME_RELATIVE[granularity]),
                    evidence,
                    reference,
                )
            else:
                add("time", rng.choice(TIME_ABSOLUTE).format(name=name, when=_when(rec.time)), evidence)
        if rec.type == "episodic" and rec.location:
            same = [r for r in of(name, "episodic") if r.location == rec.location]
            add("location", f"What did {name} do at {rec.location}?", same)
        if rec.type == "fact" and rec.location and "home" not in rec.keywords:  # a relative's work city
            same = [r for r in of(name, "fact") if r.location == rec.location and "home" not in r.keywords]
            add("location", f"Who in {name}'s family works in {rec.location}?", same)
            relation = rec.content.split("'s ", 1)[1].split()[0]
            add("content", f"What does {name}'s {relation} do for a living?", [rec])
        if rec.type == "profile":
            topic = rec.keywords[1]
            same = [r for r in of(name, "profile") if r.content == rec.content]
            add("profile", rng.choice(PROFILE_QUESTIONS[topic]).format(name=name), same)
        if rec.type == "episodic" and (topic := rec.keywords[1]) in EVENT_QUESTIONS:
            same = [r for r in of(name, "episodic") if r.keywords[1] == topic]
            add("content", rng.choice(EVENT_QUESTIONS[topic]).format(name=name), same)
    for chain in _home_chains(records):
        name = chain[-1].speaker
        if len(chain) == 1:
            add("content", f"Where does {name} live?", chain)
        else:
            add(
                "update",
                rng.choice(HOME_NOW).format(name=name),
                chain[-1:],
                current=chain[-1].source_turns[-1],
                stale=_turns(chain[:-1]),
            )
    out = []
    for kind in CLASSES:
        unique = list({(q.question, q.reference_date): q for q in candidates[kind]}.values())
        out += sorted(rng.sample(unique, min(per_class, len(unique))), key=lambda q: q.id)
    return out


def truth_records(dialogue: ToyDialogue | AssistantChat, content_only: bool = False) -> list[dict]:
    """The dialogue's ground-truth records as the runtime stores them (optionally without dimensions)."""
    times = {t.id: t.session_time for t in dialogue.conversation.turns}

    def row(rec: TruthRecord) -> dict:
        fields = rec.answer(rec.source_turns)
        if content_only:
            fields.update(type="fact", time=None, **dict.fromkeys(DIMENSIONS))
            fields["keywords"] = [rec.speaker]
        return {
            **fields,
            "id": rec.id,
            "conversation_id": dialogue.conversation.id,
            "session_time": times[rec.source_turns[-1]],
        }

    return [row(rec) for rec in dialogue.records]
