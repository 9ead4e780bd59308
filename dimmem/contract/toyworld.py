"""A seeded toy world: multi-session dialogues written from ground-truth DimMem records.

Two named people meet over dated sessions and tell each other about events (told with relative times:
"yesterday", "last week", "next month"), places, reasons and purposes, lasting preferences, relatives
referred to by pronoun in a second turn, home towns that change later, and plenty of small talk that
holds no memory. Every record is written first and the turns are rendered from it, so the truth is
exact: `OracleTeacher` (in `data_gen.oracle`) labels windows from it without any LLM.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, make_dataclass
from datetime import date, datetime, timedelta

from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.records import MEMORY_FIELDS, MemoryRecord, memory_record
from dimmem.contract.timespan import parse_span

PEOPLE = [
    ("Alice", "she"),
    ("Bob", "he"),
    ("Carmen", "she"),
    ("Dev", "he"),
    ("Elena", "she"),
    ("Farid", "he"),
    ("Grace", "she"),
    ("Hugo", "he"),
    ("Iris", "she"),
    ("Jonas", "he"),
]
CITIES = ["Lisbon", "Denver", "Austin", "Kyoto", "Oslo", "Lima", "Porto", "Seattle"]
# (what I did, what they did, keyword, places, reasons, purposes)
EVENTS = [
    (
        "went hiking",
        "went hiking",
        "hiking",
        ["Eagle Peak", "the river trail"],
        ["I needed a break from work", "the weather was perfect"],
        ["to train for a marathon", None],
    ),
    (
        "visited the art museum",
        "visited the art museum",
        "art museum",
        ["the city center", None],
        ["a friend recommended it", None],
        ["to see the new painting exhibit", None],
    ),
    (
        "ran a charity race",
        "ran a charity race",
        "charity race",
        ["the harbor", "the park"],
        [None, "my cousin asked me to join"],
        ["to raise money for the animal shelter", "to raise money for the library"],
    ),
    (
        "started a pottery class",
        "started a pottery class",
        "pottery class",
        ["the community center", None],
        ["I wanted a new hobby", None],
        ["to make gifts for my family", None],
    ),
    (
        "adopted a puppy",
        "adopted a puppy",
        "puppy",
        ["the animal shelter", None],
        ["I wanted company at home", None],
        [None],
    ),
    (
        "went camping",
        "went camping",
        "camping",
        ["the lake", "the forest"],
        ["my kids love the outdoors", None],
        ["to watch the meteor shower", None],
    ),
    (
        "baked bread",
        "baked bread",
        "baking",
        [None],
        ["I had a free afternoon", None],
        ["for a picnic with friends", None],
    ),
    (
        "attended a concert",
        "attended a concert",
        "concert",
        ["the old theater", "the stadium"],
        [None, "I won free tickets"],
        [None],
    ),
]
PLANS = [
    (
        "am going to visit my parents",
        "is going to visit {pos} parents",
        "visit parents",
        ["to celebrate my dad's birthday", None],
    ),
    ("will start a new job", "will start a new job", "new job", [None, "to work closer to home"]),
    ("am taking a trip to the coast", "is taking a trip to the coast", "trip", ["to relax", None]),
]
PREFERENCES = [
    (
        "I really love jazz, I listen to it every evening.",
        "{name} loves jazz and listens to it every evening.",
        ["jazz", "music"],
    ),
    (
        "I'm allergic to peanuts, so I always check the menu.",
        "{name} is allergic to peanuts.",
        ["peanut allergy"],
    ),
    ("Honestly, I prefer tea over coffee.", "{name} prefers tea over coffee.", ["tea", "coffee"]),
    (
        "I'm a morning person, I wake up at five every day.",
        "{name} is a morning person who wakes up at five every day.",
        ["morning person"],
    ),
    ("I can't stand horror movies.", "{name} dislikes horror movies.", ["horror movies"]),
    ("My favorite food is spicy ramen.", "{name}'s favorite food is spicy ramen.", ["spicy ramen", "food"]),
]
RELATIVES = [("sister", "she"), ("brother", "he"), ("cousin", "she"), ("uncle", "he")]
RELATIVE_NAMES = {"she": ["Nora", "Maya", "Rosa"], "he": ["Leo", "Omar", "Theo"]}
JOBS = ["a nurse", "a teacher", "an engineer", "a chef", "a pilot"]
GREETINGS = ["Hey! How have you been?", "Good to see you again!", "Hi there, long time no see!"]
GREETING_REPLIES = ["Hi! Doing well, thanks.", "Great to see you too!", "Hey! Busy but good."]
SMALL_TALK = [
    "Haha, that's great.",
    "Oh nice!",
    "Sounds fun!",
    "Wow, really?",
    "That's so cool.",
    "Same here, busy as always.",
    "Totally agree.",
    "Anyway, how's your week going?",
    "Not much new on my side.",
    "Ha, I know what you mean.",
    "That makes sense.",
    "Good for you!",
]
QUERIES_PER_DIALOGUE = 6
REPLIES = [
    "That sounds amazing!",
    "Wow, good for you!",
    "How was it?",
    "I'm happy for you.",
    "That's lovely.",
    "Nice, tell me more!",
]


def _answer(self, source_turns: list[str]) -> dict:
    """The record as an extractor answers it, citing the given (window-local) ids."""
    known = {name: getattr(self, name) for name in MEMORY_FIELDS}
    return memory_record(**{**known, "source_turns": source_turns, "keywords": list(self.keywords)})


# A ground-truth memory in global form (source turns are conversation turn ids): its id, the contract's
# fields (one definition: `MemoryRecord`), and the id of the record it replaces, if any.
TruthRecord = make_dataclass(
    "TruthRecord",
    [
        ("id", str),
        *((name, info.annotation) for name, info in MemoryRecord.model_fields.items()),
        ("supersedes", str | None, field(default=None)),
    ],
    namespace={"answer": _answer, "__doc__": "A ground-truth memory in global form (contract fields)."},
)


@dataclass
class ToyQuery:
    id: str
    question: str
    reference_date: str
    truth: dict  # the parse_query answer


@dataclass
class ToyDialogue:
    conversation: Conversation
    records: list[TruthRecord] = field(default_factory=list)
    queries: list[ToyQuery] = field(default_factory=list)


def _relative(rng: random.Random, day: date, future: bool) -> tuple[str, str]:
    """A relative time phrase and its normalized ISO form, resolved against the session day."""
    if future:
        options = [
            ("tomorrow", (day + timedelta(days=1)).isoformat()),
            ("next month", f"{(day.replace(day=1) + timedelta(days=32)):%Y-%m}"),
            ("next Saturday", (day + timedelta(days=(5 - day.weekday()) % 7 or 7)).isoformat()),
        ]
    else:
        last_monday = day - timedelta(days=day.weekday() + 7)
        options = [
            ("yesterday", (day - timedelta(days=1)).isoformat()),
            ("two days ago", (day - timedelta(days=2)).isoformat()),
            ("last week", f"{last_monday.isoformat()}/{(last_monday + timedelta(days=6)).isoformat()}"),
            ("last month", f"{(day.replace(day=1) - timedelta(days=1)):%Y-%m}"),
            ("last Friday", (day - timedelta(days=(day.weekday() - 4) % 7 or 7)).isoformat()),
        ]
    return rng.choice(options)


class _Writer:
    """Builds one dialogue turn by turn, with records attached to the turns that state them."""

    def __init__(self, conv_id: str, rng: random.Random):
        self.conv_id, self.rng = conv_id, rng
        self.turns: list[Turn] = []
        self.records: list[TruthRecord] = []
        self.session = 0
        self.when: datetime | None = None
        self.n = 0
        self.roles: dict[str, str] = {}  # speaker -> turn role (default: participant)

    def new_session(self, when: datetime) -> None:
        self.session, self.when, self.n = self.session + 1, when, 0

    def say(self, speaker: str, text: str) -> str:
        self.n += 1
        turn = Turn(
            id=f"D{self.session}:{self.n}",
            speaker=speaker,
            role=self.roles.get(speaker, "participant"),
            text=text,
            session_id=f"S{self.session}",
            session_time=self.when.isoformat(timespec="minutes"),
        )
        self.turns.append(turn)
        return turn.id

    def record(
        self,
        turns: list[str],
        speaker: str,
        content: str,
        type_: str,
        keywords: list[str],
        time=None,
        location=None,
        reason=None,
        purpose=None,
        supersedes=None,
    ) -> TruthRecord:
        rec = TruthRecord(
            id=f"{self.conv_id}#m{len(self.records) + 1}",
            source_turns=turns,
            speaker=speaker,
            content=content,
            type=type_,
            time=time,
            location=location,
            reason=reason,
            purpose=purpose,
            keywords=keywords,
            supersedes=supersedes,
        )
        self.records.append(rec)
        return rec


def _when_text(iso: str) -> str:
    """A record time as a record's content states it: 'on 2023-05-07', 'in 2023-05', 'during A to B'."""
    if len(iso) == 7:
        return f"in {iso}"
    return f"during {iso.replace('/', ' to ')}" if "/" in iso else f"on {iso}"


def _third(phrase: str | None, pron: str, pos: str) -> str | None:
    """'I needed a break from my job' -> 'she needed a break from her job'."""
    if phrase is None:
        return None
    words = []
    for word in phrase.split():
        words.append(
            {"I": pron, "my": pos, "me": "her" if pron == "she" else "him", "I'm": f"{pron} is"}.get(
                word, word
            )
        )
    return " ".join(words)


def generate_dialogue(index: int, seed: int, sessions: int = 4, stories_per_session: int = 4) -> ToyDialogue:
    rng = random.Random(f"{seed}:{index}")
    (a, a_pron), (b, b_pron) = rng.sample(PEOPLE, 2)
    people = {a: a_pron, b: b_pron}
    w = _Writer(f"toy-{index:04d}", rng)
    homes: dict[str, TruthRecord] = {}
    when = datetime(2023, 1, 2, 9, 0) + timedelta(days=rng.randrange(300), hours=rng.randrange(10))
    for _ in range(sessions):
        w.new_session(when)
        opener = rng.choice([a, b])
        w.say(opener, rng.choice(GREETINGS))
        w.say(b if opener == a else a, rng.choice(GREETING_REPLIES))
        for _ in range(stories_per_session):
            teller = rng.choice([a, b])
            listener = b if teller == a else a
            _story(w, rng, teller, people[teller], listener, homes)
            if rng.random() < 0.4:
                w.say(rng.choice([a, b]), rng.choice(SMALL_TALK))
        when += timedelta(days=rng.randrange(4, 25), hours=rng.randrange(-3, 4))
    queries = _queries(w.records, f"toy-{index:04d}", w.turns[-1].session_time)
    queries = sorted(
        rng.sample(queries, min(QUERIES_PER_DIALOGUE, len(queries))),
        key=lambda q: int(q.id.rsplit("q", 1)[1]),
    )
    metadata = {
        "source": "toy",
        "seed": seed,
        "queries": [
            {"id": q.id, "question": q.question, "reference_date": q.reference_date} for q in queries
        ],
    }
    return ToyDialogue(Conversation(w.conv_id, w.turns, metadata), w.records, queries)


def _story(w: _Writer, rng: random.Random, name: str, pron: str, listener: str, homes: dict) -> None:
    """One thing `name` tells `listener`: the turns that state it, its records, and the listener's reply."""
    pos = "her" if pron == "she" else "his"
    kind = rng.choice(["event", "event", "plan", "preference", "relative", "home"])
    if kind == "home":
        _home_story(w, rng, name, listener, homes)
    elif kind == "event":
        _event_story(w, rng, name, pron, pos, listener)
    elif kind == "plan":
        _plan_story(w, rng, name, pron, pos, listener)
    elif kind == "preference":
        _preference_story(w, rng, name, listener)
    else:
        _family_story(w, rng, name, listener)


def _home_story(w: _Writer, rng: random.Random, name: str, listener: str, homes: dict) -> None:
    """Where `name` lives, or, once known, a move to another city that supersedes it."""
    day = w.when.date()
    city = rng.choice([c for c in CITIES if name not in homes or c != homes[name].location])
    if name not in homes:
        turn = w.say(name, f"I live in {city}, it's a nice place.")
        homes[name] = w.record(
            [turn], name, f"{name} lives in {city}.", "fact", [name, city, "home"], location=city
        )
    else:
        old = homes[name]
        phrase, iso = _relative(rng, day, future=False)
        if old.time and parse_span(iso)[0] < parse_span(old.time)[0]:  # not before the move it follows
            phrase, iso = "yesterday", (day - timedelta(days=1)).isoformat()
        turn = w.say(name, f"Big news: I moved from {old.location} to {city} {phrase}!")
        homes[name] = w.record(
            [turn],
            name,
            f"{name} moved from {old.location} to {city} and now lives in {city}.",
            "fact",
            [name, city, "home"],
            time=iso,
            location=city,
            supersedes=old.id,
        )
    w.say(listener, rng.choice(REPLIES))


def _event_story(w: _Writer, rng: random.Random, name: str, pron: str, pos: str, listener: str) -> None:
    """A past event, with its place, reason and purpose when it has them."""
    mine, theirs, keyword, places, reasons, purposes = rng.choice(EVENTS)
    place, reason, purpose = rng.choice(places), rng.choice(reasons), rng.choice(purposes)
    phrase, iso = _relative(rng, w.when.date(), future=False)
    if rng.random() < 0.5:  # asked first: the memory comes from the answer
        w.say(listener, rng.choice(["What have you been up to?", f"Anything new, {name}?"]))
    text = f"I {mine}{f' at {place}' if place else ''} {phrase}"
    text += f" because {reason}" if reason else ""
    text += f", {purpose}" if purpose else ""
    turn = w.say(name, text + ".")
    when_text = _when_text(iso)
    content = f"{name} {theirs}{f' at {place}' if place else ''} {when_text}"
    content += f" because {_third(reason, pron, pos)}" if reason else ""
    content += f", {_third(purpose, pron, pos)}" if purpose else ""
    w.record(
        [turn],
        name,
        content + ".",
        "episodic",
        [name, keyword] + ([place] if place else []),
        time=iso,
        location=place,
        reason=_third(reason, pron, pos),
        purpose=_third(purpose, pron, pos),
    )
    w.say(listener, rng.choice(REPLIES))


def _plan_story(w: _Writer, rng: random.Random, name: str, pron: str, pos: str, listener: str) -> None:
    """A plan for a day or a month ahead, with its purpose when it has one."""
    mine, theirs, keyword, purposes = rng.choice(PLANS)
    purpose = rng.choice(purposes)
    phrase, iso = _relative(rng, w.when.date(), future=True)
    turn = w.say(name, f"I {mine} {phrase}" + (f" {purpose}" if purpose else "") + ".")
    when_text = f"in {iso}" if len(iso) == 7 else f"on {iso}"
    content = (
        f"{name} {theirs.format(pos=pos)} {when_text}"
        + (f" {_third(purpose, pron, pos)}" if purpose else "")
        + "."
    )
    w.record([turn], name, content, "episodic", [name, keyword], time=iso, purpose=_third(purpose, pron, pos))
    w.say(listener, rng.choice(["Good luck!", "Have fun!", "Exciting!"]))


def _preference_story(w: _Writer, rng: random.Random, name: str, listener: str) -> None:
    """A lasting preference: a profile record."""
    said, content, keywords = rng.choice(PREFERENCES)
    turn = w.say(name, said)
    w.record([turn], name, content.format(name=name), "profile", [name, *keywords])
    w.say(listener, rng.choice(["Same here!", "Really? I didn't know that.", "Ha, good to know."]))


def _family_story(w: _Writer, rng: random.Random, name: str, listener: str) -> None:
    """A relative introduced, then referred to by pronoun in the next turn: the second record cites both."""
    relation, rel_pron = rng.choice(RELATIVES)
    rel_name, job, city = rng.choice(RELATIVE_NAMES[rel_pron]), rng.choice(JOBS), rng.choice(CITIES)
    phrase, iso = _relative(rng, w.when.date(), future=False)
    first = w.say(name, f"My {relation} {rel_name} came to visit {phrase}.")
    w.record(
        [first],
        name,
        f"{name}'s {relation} {rel_name} visited {name} {'in' if len(iso) == 7 else 'on'} {iso}.",
        "episodic",
        [name, rel_name, relation],
        time=iso,
    )
    w.say(
        listener,
        rng.choice(["Oh, what does " + rel_pron + " do?", "Nice, is " + rel_pron + " still working?"]),
    )
    second = w.say(name, f"{rel_pron.capitalize()} works as {job} in {city} now.")
    w.record(
        [first, second],
        name,
        f"{name}'s {relation} {rel_name} works as {job} in {city}.",
        "fact",
        [name, rel_name, job.split()[-1]],
        location=city,
    )


def _queries(records: list[TruthRecord], conv_id: str, reference: str) -> list[ToyQuery]:
    """Questions about the dialogue, each with its parse_query answer."""
    out = []
    for i, rec in enumerate(records):
        topic = [k for k in rec.keywords if k != rec.speaker][:2]
        if rec.type == "episodic" and rec.time and len(rec.time) == 7:
            question, time = (
                f"What did {rec.speaker} do in {datetime.strptime(rec.time, '%Y-%m'):%B %Y}?",
                rec.time,
            )
            keywords = [rec.speaker]
        elif rec.type == "episodic":
            question, time, keywords = f"When was {rec.speaker}'s {topic[0]}?", None, [rec.speaker, topic[0]]
        elif rec.type == "profile":
            question, time, keywords = (
                f"What does {rec.speaker} think about {topic[0]}?",
                None,
                [rec.speaker, topic[0]],
            )
        else:
            question, time, keywords = (
                f"What do we know about {rec.speaker}'s {topic[-1]}?",
                None,
                [rec.speaker, topic[-1]],
            )
        truth = {
            "target_types": [rec.type],
            "time": time,
            "location": None,
            "keywords": keywords,
            "need_assistant_context": False,
        }
        out.append(ToyQuery(f"{conv_id}#q{i + 1}", question, reference, truth))
    return out


def generate_world(
    n_dialogues: int, seed: int = 0, sessions: int = 4, stories_per_session: int = 4
) -> list[ToyDialogue]:
    return [generate_dialogue(i, seed, sessions, stories_per_session) for i in range(n_dialogues)]


# User-assistant chats: the user asks for help, the assistant recommends, explains or promises; a memory
# holds what the user said and points at the turn, so the assistant's own reply is recalled through it.
# (topic keyword, what the user says, what the assistant replies, the record's content,
#  a question that needs the assistant's reply, a question about what the user said)
ADVICE = [
    (
        "knee",
        "My knee has been sore since my run {phrase}.",
        "I'd suggest icing it for 20 minutes twice a day and swimming instead of running for two weeks.",
        "{name}'s knee has been sore since a run {when}.",
        "What did you suggest for my knee?",
        "What happened to my knee?",
    ),
    (
        "sleep",
        "I keep waking up at 3am and can't fall asleep again.",
        "Try keeping your phone out of the bedroom and going to bed at 10:30 every night.",
        "{name} keeps waking up at 3am and cannot fall asleep again.",
        "What did you recommend for my sleep?",
        "What trouble do I have at night?",
    ),
    (
        "savings",
        "I want to save enough for a trip to Japan.",
        "I recommend putting 15% of each paycheck into a separate savings account.",
        "{name} wants to save enough for a trip to Japan.",
        "Remind me what you told me about saving money?",
        "Where do I want to travel?",
    ),
    (
        "book",
        "I'm looking for a good science fiction novel to read.",
        "You might enjoy The Left Hand of Darkness by Ursula K. Le Guin.",
        "{name} asked for a good science fiction novel to read.",
        "Which book did you recommend to me?",
        "What kind of novel am I looking for?",
    ),
    (
        "basil",
        "My basil plant is wilting on the windowsill.",
        "Water it only when the top inch of soil is dry and give it six hours of sun.",
        "{name}'s basil plant is wilting on the windowsill.",
        "What did you tell me to do about my basil?",
        "Which of my plants is wilting?",
    ),
    (
        "spanish",
        "I'm learning Spanish but I keep forgetting new words.",
        "I suggest fifteen minutes of spaced-repetition flashcards every morning.",
        "{name} is learning Spanish and keeps forgetting new words.",
        "What did you suggest for my Spanish?",
        "Which language am I learning?",
    ),
    (
        "dentist",
        "Can you remind me about my dentist appointment next Monday?",
        "I promise to remind you: the dentist appointment is next Monday at 9am.",
        "{name} asked to be reminded about a dentist appointment next Monday.",
        "What did you promise to remind me about?",
        "What appointment do I have?",
    ),
    (
        "chickpeas",
        "What can I cook with the chickpeas in my pantry?",
        "Try a chickpea curry with coconut milk, spinach and cumin.",
        "{name} asked what to cook with the chickpeas in the pantry.",
        "What recipe did you give me?",
        "What do I have in my pantry?",
    ),
]
ASSISTANT_OPENERS = ["Hi! How can I help today?", "Hello again, what's on your mind?"]


@dataclass
class AssistantChat:
    conversation: Conversation
    records: list[TruthRecord]
    # (question, the assistant turn that answers it, or None; the user turn it is about)
    questions: list[tuple[str, str | None, str]]


def generate_assistant_chat(
    index: int, seed: int, sessions: int = 4, stories_per_session: int = 2
) -> AssistantChat:
    """One user's chats with an assistant: each session two or three requests for help, each answered
    with a recommendation, an explanation or a promise, and the user's own news between them (the toy
    world's stories). Records state what the user said (pointing at the user turn); each request gets
    a question that needs the assistant's reply and one that does not."""
    rng = random.Random(f"{seed}:assistant:{index}")
    name, pron = rng.choice(PEOPLE)
    w = _Writer(f"chat-{index:04d}", rng)
    w.roles = {name: "user", "assistant": "assistant"}
    homes: dict[str, TruthRecord] = {}
    when = datetime(2023, 1, 2, 9, 0) + timedelta(days=rng.randrange(300))
    topics = rng.sample(ADVICE, min(len(ADVICE), sessions * 3))
    questions = []
    for session in range(sessions):
        w.new_session(when)
        w.say("assistant", rng.choice(ASSISTANT_OPENERS))
        for keyword, said, reply, content, needs, about in topics[
            session * 3 : session * 3 + rng.choice([2, 3])
        ]:
            phrase, iso = _relative(rng, when.date(), future=False)
            asked = w.say(name, said.format(phrase=phrase))
            answered = w.say("assistant", reply)
            w.record(
                [asked],
                name,
                content.format(name=name, when=_when_text(iso)),
                "episodic" if "{phrase}" in said else "fact",
                [name, keyword],
                time=iso if "{phrase}" in said else None,
            )
            questions += [(needs, answered, asked), (about, None, asked)]
            for _ in range(stories_per_session):  # the user's own news: the records the help competes with
                _story(w, rng, name, pron, "assistant", homes)
            if rng.random() < 0.5:
                w.say(name, rng.choice(["Thanks!", "Great, thank you.", "I'll try that."]))
        when += timedelta(days=rng.randrange(4, 25))
    conversation = Conversation(w.conv_id, w.turns, {"source": "toy-assistant", "seed": seed})
    return AssistantChat(conversation, w.records, questions)
