"""The annotations teacher (data_gen/annotations.py) and speaker-renamed copies (data_gen/augment.py):
dates resolved at their grain, records placed where their evidence is new, a datagen run that labels,
quarantines by rule and reports coverage, and copies whose names are consistent everywhere."""

from __future__ import annotations

import json
import random
from datetime import date

import pytest

from data_gen.annotations import (
    AnnotationTeacher,
    find_time,
    keywords_of,
    location_of,
    phrase_of,
    record_type,
)
from data_gen.augment import base_id, lookalike, rename, renamed_copies
from data_gen.cli import main as datagen_main
from dimmem.contract.loaders.locomo import load_locomo
from dimmem.contract.validate import validate
from dimmem.contract.windows import window_conversations

MONDAY = date(2023, 5, 8)  # LoCoMo conv-26's first session


@pytest.mark.parametrize(
    "text,time,phrase",
    [
        ("I went to a support group yesterday.", "2023-05-07", "on 2023-05-07"),
        ("We ran a charity race last Saturday", "2023-05-06", "on 2023-05-06"),
        ("She painted it last week.", "2023-05-01/2023-05-07", "in the week of 2023-05-01"),
        ("They camped last weekend.", "2023-05-06/2023-05-07", "on the weekend of 2023-05-06"),
        ("He moved here 3 weeks ago", "2023-04-17/2023-04-23", "in the week of 2023-04-17"),
        ("The show opens next month!", "2023-06", "in June 2023"),
        ("I painted that lake sunrise last year.", "2022", "in 2022"),
        ("Two years ago I quit my job", "2021", "in 2021"),
        ("We met in 2016 at a concert", "2016", "in 2016"),
        ("The wedding is on June 3, 2023.", "2023-06-03", "on 2023-06-03"),
    ],
)
def test_time_expressions_resolve_at_their_grain(text, time, phrase):
    found = find_time(text, MONDAY)
    assert found is not None and (found[0], found[2]) == (time, phrase)


@pytest.mark.parametrize("text", ["She recently adopted a dog.", "I love painting.", "May I come along?"])
def test_no_date_is_invented(text):
    assert find_time(text, MONDAY) is None


def test_dimension_rules():
    people = {"Caroline", "Melanie"}
    assert record_type("Melanie loves pottery.", dated=False) == "profile"
    assert record_type("Melanie ran a charity race.", dated=False) == "episodic"
    assert record_type("Melanie has two kids.", dated=False) == "fact"
    assert record_type("Melanie has two kids.", dated=True) == "episodic"
    assert location_of("Her family visited the Grand Canyon and loved it.", people) == "Grand Canyon"
    assert location_of("She is proud of her in the LGBTQ community.", people) is None  # a modifier
    assert location_of("Melanie went to Caroline for help.", people) is None  # a person, not a place
    words = keywords_of(
        "Melanie supports Caroline's drive to make a difference in LGBTQ rights.", "Melanie", people
    )
    assert words[:2] == ["Melanie", "Caroline"] and len(words) <= 5
    assert len({w.casefold() for w in words}) == len(words)
    assert "LGBTQ" in words


@pytest.fixture(scope="module")
def conv26(locomo_path):
    return next(c for c in load_locomo(locomo_path) if c.id == "conv-26")


def test_labels_are_the_observations_where_their_evidence_is_new(conv26):
    teacher = AnnotationTeacher([conv26])
    windows = window_conversations([conv26], 25, 5)
    first = teacher.memories(windows[0])
    for w in windows:
        answer = {"memories": teacher.memories(w)}
        assert validate("extract", answer, w.scope).ok, w.id
    # the DESIGN example: "recently" in the observation, "yesterday" in its turn (D1:3)
    group = next(m for m in first if "support group" in m["content"])
    assert group == {
        **group,
        "source_turns": ["t3"],
        "speaker": "Caroline",
        "content": "Caroline attended an LGBTQ support group on 2023-05-07 and found the transgender stories "
        "inspiring.",
        "type": "episodic",
        "time": "2023-05-07",
    }
    placed = sum(len(teacher.memories(w)) for w in windows)
    coverage = teacher.coverage([])
    assert placed == coverage["records"] == coverage["observations_placed"] + coverage["events_placed"]
    assert coverage["observations_placed"] == coverage["observations"] > 150
    assert sum(coverage["not_placed"].values()) + coverage["events_placed"] == coverage["events"]


@pytest.mark.parametrize(
    "time,phrase",
    [
        ("2023-05-07", "on 2023-05-07"),
        ("2023-06", "in June 2023"),
        ("2022", "in 2022"),
        ("2023-05-01/2023-05-07", "in the week of 2023-05-01"),
        ("2023-05-06/2023-05-07", "on the weekend of 2023-05-06"),
        ("2023-06/2023-08", "between June 2023 and August 2023"),
        ("2023-05-02/2023-05-04", "between 2023-05-02 and 2023-05-04"),
    ],
)
def test_a_time_reads_as_a_phrase(time, phrase):
    assert phrase_of(time) == phrase


def test_labels_carry_the_dimensions_read_from_the_dialogue(conv26):
    """conv-26 was read (docs/locomo-dimensions.md): its labels take time, location, reason and purpose
    from the reading, and the content says the reading's date in place of its relative expression."""
    teacher = AnnotationTeacher([conv26])
    records = [m for w in window_conversations([conv26], 25, 5) for m in teacher.memories(w)]
    group = next(m for m in records if "activist group called" in m["content"])
    assert (group["time"], group["content"]) == (
        "2023-07-18",
        "Caroline joined a new LGBTQ activist group called 'Connected LGBTQ Activists' on 2023-07-18.",
    )
    parade = next(m for m in records if "activist group participated in a pride parade" in m["content"])
    assert parade["time"] == "2023-07-15/2023-07-16" and "on the weekend of 2023-07-15" in parade["content"]
    assert parade["purpose"] == "to celebrate love and diversity"
    filled = {d: sum(m[d] is not None for m in records) for d in ("time", "location", "reason", "purpose")}
    assert all(n >= 20 for n in filled.values()), filled


def test_a_label_is_told_by_its_person_citing_only_their_turns(conv26):
    """An observation is told by its person, citing only the person's turns (a served record cites its
    speaker's turns only); one whose person speaks none of its evidence ("Melanie said Caroline's
    painting was lovely") is told by the evidence's speaker."""
    from data_gen.annotations import place

    speaker_of = {t.id: t.speaker for t in conv26.turns}
    placed, _ = place(conv26)
    observations = [p for p in placed if p.kind == "observation"]
    assert sum(speaker_of[p.cites[0]] != p.gold.person for p in observations) == 2
    for p in observations:
        tellers = {speaker_of[t] for t in p.cites}
        assert len(tellers) == 1
        spoke = {speaker_of[t] for t in p.gold.evidence}
        assert tellers == ({p.gold.person} if p.gold.person in spoke else {speaker_of[p.gold.evidence[0]]})


def test_a_reading_attaches_only_to_the_text_it_was_read_for(locomo_path, tmp_path):
    """The dimensions file names each annotation by place and a hash of its text: an edited annotation
    loses its reading (no dimensions) instead of taking another's."""
    data = json.loads(locomo_path.read_text())
    conv = next(s for s in data if s["sample_id"] == "conv-26")
    conv["observation"]["session_10_observation"]["Caroline"][0][0] = "Caroline joined a choir."
    path = tmp_path / "edited.json"
    path.write_text(json.dumps([conv]))
    from dimmem.contract.annotations import conversation_gold

    gold = conversation_gold(load_locomo(path)[0]).observations
    edited = next(g for g in gold if g.path == ("session_10_observation", "Caroline", 0))
    kept = next(g for g in gold if g.path == ("session_10_observation", "Caroline", 1))
    assert edited.dimensions is None and kept.dimensions is not None


def test_a_renamed_copy_renames_its_dimensions(locomo_path):
    from dimmem.contract.annotations import conversation_gold

    conv30 = next(c for c in load_locomo(locomo_path) if c.id == "conv-30")
    copy = rename(conv30, {"Jon": "Mara", "Gina": "Mira"}, 1)

    def texts(conv):
        return [v for g in conversation_gold(conv).observations for v in (g.dimensions or {}).values() if v]

    assert "taking Gina's advice" in texts(conv30) and "taking Mira's advice" in texts(copy)
    assert not any("Jon" in t or "Gina" in t for t in texts(copy))
    original = conversation_gold(conv30).observations
    assert [g.dimensions is None for g in conversation_gold(copy).observations] == [
        g.dimensions is None for g in original
    ]


def locomo_file(tmp_path, observation_text="Ann adopted a beagle named Rex yesterday."):
    """A two-session LoCoMo file: annotations with one observation per session and an event."""
    sample = {
        "sample_id": "tiny-1",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bob",
            "session_1_date_time": "10:00 am on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a beagle named Rex yesterday!"},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Nice, Ann! I moved to Lisbon last year."},
            ],
            "session_2_date_time": "10:00 am on 15 May, 2023",
            "session_2": [
                {"speaker": "Bob", "dia_id": "D2:1", "text": "Hey Ann, how is Rex?"},
                {"speaker": "Ann", "dia_id": "D2:2", "text": "Great! We ran a charity race for shelters."},
            ],
        },
        "observation": {
            "session_1_observation": {
                "Ann": [[observation_text, "D1:1"]],
                "Bob": [["Bob moved to Lisbon last year.", "D1:2"]],
            },
            "session_2_observation": {"Ann": [["Ann ran a charity race for shelters.", "D2:2"]]},
        },
        "event_summary": {
            "events_session_1": {"Ann": [], "Bob": [], "date": "8 May, 2023"},
            "events_session_2": {
                "Ann": ["Ann and Rex run a charity race for animal shelters."],
                "Bob": [],
                "date": "15 May, 2023",
            },
        },
        "qa": [],
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([sample, {**sample, "sample_id": "tiny-2"}]))
    return path


def config(tmp_path, source: str, **extra) -> str:
    cfg = {
        "source": {"format": "locomo", "input": source},
        "out": str(tmp_path / "out"),
        "windows": {"window": 3, "overlap": 1, "max_tokens": None},
        "teacher": {"kind": "annotations"},
        "tasks": {"extract": True, "parse_query": False, "consolidate": False},
        "split": {"validation": 0.0, "test": 0.0},
        **extra,
    }
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_a_run_labels_reports_coverage_and_holds_out(tmp_path, capsys):
    source = locomo_file(tmp_path)
    cfg = config(tmp_path, str(source), augment={"renamed_copies": 1, "seed": 3})
    assert datagen_main(["--config", cfg, "--set", "source.exclude=[tiny-2]", "--quiet"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    coverage = report["coverage"]
    assert (coverage["observations"], coverage["observations_kept"], coverage["quarantined"]) == (6, 6, {})
    assert coverage["not_placed"] == {"event_restates_an_observation": 2}  # the race, told twice
    assert report["held_out"]["conversations"][0]["conversation"] == "tiny-2"
    assert report["held_out"]["flagged"] == ["tiny-2"]  # the same turns: the check sees the copy
    labels = [json.loads(line) for line in (tmp_path / "out" / "labels.jsonl").open()]
    assert {row["conversation_id"] for row in labels} == {"tiny-1", "tiny-1~r1"}
    rex = next(m for row in labels if row["conversation_id"] == "tiny-1" for m in row["memories"])
    assert (rex["content"], rex["time"], rex["source_turns"]) == (
        "Ann adopted a beagle named Rex on 2023-05-07.",
        "2023-05-07",
        ["D1:1"],
    )
    copy = [m for row in labels if row["conversation_id"] == "tiny-1~r1" for m in row["memories"]]
    assert copy and not any("Ann" in m["content"] or m["speaker"] in ("Ann", "Bob") for m in copy)


def test_a_bad_annotation_is_quarantined_by_rule(tmp_path):
    source = locomo_file(tmp_path, observation_text="   ")
    assert datagen_main(["--config", config(tmp_path, str(source)), "--quiet"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    lost = report["coverage"]["quarantined"]
    # the first window of each conversation holds the blank one and Bob's: both go with the window
    assert report["quarantined"] == 2
    assert lost == {"observation: invalid after 1 repair round(s): content_empty": 4}
    assert report["coverage"]["observations_kept"] == 2


@pytest.mark.parametrize(
    "override,message",
    [
        ("tasks.parse_query=true", "labels extraction only"),
        ("source.exclude=[nope]", "source.exclude: ['nope'] not in the source"),
    ],
)
def test_annotation_config_mistakes_are_one_line(tmp_path, capsys, override, message):
    cfg = config(tmp_path, str(locomo_file(tmp_path)))
    assert datagen_main(["--config", cfg, "--set", override, "--quiet"]) == 2
    assert message in capsys.readouterr().err


def test_a_source_without_annotations_is_refused(tmp_path, capsys):
    lines = [{"role": "user", "content": "hi", "timestamp": "2024-01-01"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"id": "c1", "messages": lines}) + "\n")
    cfg = config(tmp_path, str(path))
    assert datagen_main(["--config", cfg, "--set", "source.format=chat_jsonl", "--quiet"]) == 2
    assert "carry no annotations" in capsys.readouterr().err


def test_renamed_copies_rename_everywhere(conv26):
    (copy,) = renamed_copies([conv26], copies=1, seed=0, lookalike_share=0.0)
    mapping = dict(zip(conv26.speakers, copy.speakers))
    assert copy.id == "conv-26~r1" and base_id(copy.id) == "conv-26"
    assert set(copy.speakers).isdisjoint(conv26.speakers)
    text = " ".join(t.text for t in copy.turns) + json.dumps(copy.metadata)
    assert "Caroline" not in text and "Melanie" not in text
    assert " Mel!" not in text and f" {mapping['Melanie']}!" in text  # the nickname, renamed with the name
    assert set(copy.metadata["observation"]["session_1_observation"]) == set(mapping.values())
    assert [t.id for t in copy.turns] == [t.id for t in conv26.turns]


def test_lookalike_names_differ_by_one_vowel(conv26):
    rng = random.Random(0)
    for name in ("Mara", "Tomas", "Jin", "Zeynep"):
        other = lookalike(name, rng)
        assert other != name and len(other) == len(name) and other[0] == name[0]
        assert sum(a != b for a, b in zip(name, other)) == 1
    (copy,) = renamed_copies([conv26], copies=1, seed=0, lookalike_share=1.0)
    a, b = copy.speakers
    assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
    assert rename(conv26, {"Caroline": "Mara", "Melanie": "Mira"}, 7).id == "conv-26~r7"


def test_teacher_refuses_other_tasks(conv26):
    import asyncio

    class Job:
        task = "parse_query"

    with pytest.raises(ValueError, match="extract jobs only"):
        asyncio.run(AnnotationTeacher([conv26]).answer(Job(), [], 0))
