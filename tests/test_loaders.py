"""Each loader on real or published-format data, and malformed input located by file, record and field."""

import json
from pathlib import Path

import pytest

from dimmem.contract.conversation import DataFormatError
from dimmem.contract.loaders import load_conversations

FIXTURES = Path(__file__).parent / "fixtures"


def test_locomo_real_file(locomo_path):
    convs = load_conversations("locomo", locomo_path)
    assert len(convs) == 10
    assert sum(len(c.turns) for c in convs) == 5882
    first = convs[0]
    assert first.id == "conv-26" and first.speakers == ["Caroline", "Melanie"]
    turn = first.turns[2]
    assert (turn.id, turn.speaker, turn.role, turn.session_time) == (
        "D1:3",
        "Caroline",
        "participant",
        "2023-05-08T13:56",
    )
    assert "LGBTQ support group yesterday" in turn.text
    assert len(first.sessions) == 19 and first.sessions[1][1] == "2023-05-25T13:14"
    assert any("[shares a photo:" in t.text for t in first.turns)
    assert first.metadata["qa"][0]["evidence"] == ["D1:3"]


def _write(tmp_path, data, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _locomo_sample():
    return {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi"},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Hey"},
            ],
        },
    }


@pytest.mark.parametrize(
    "mutate,record,field",
    [
        (
            lambda s: s["conversation"]["session_1"][1].pop("text"),
            "0 (conv-x)",
            "conversation.session_1[1].text",
        ),
        (
            lambda s: s["conversation"]["session_1"][0].update(dia_id=7),
            "0 (conv-x)",
            "conversation.session_1[0].dia_id",
        ),
        (
            lambda s: s["conversation"].update(session_1_date_time="yesterday"),
            "0 (conv-x)",
            "conversation.session_1_date_time",
        ),
        (lambda s: s.pop("sample_id"), 0, "sample_id"),
    ],
)
def test_locomo_malformed(tmp_path, mutate, record, field):
    sample = _locomo_sample()
    mutate(sample)
    path = _write(tmp_path, [sample])
    with pytest.raises(DataFormatError) as err:
        load_conversations("locomo", path)
    assert (err.value.record, err.value.field) == (record, field)
    assert str(path) in str(err.value)


def test_locomo_duplicate_turn_id_is_rejected(tmp_path):
    sample = _locomo_sample()
    sample["conversation"]["session_1"][1]["dia_id"] = "D1:1"
    with pytest.raises(ValueError, match="duplicate turn id 'D1:1'"):
        load_conversations("locomo", _write(tmp_path, [sample]))


def test_truncated_json_names_file_and_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[{"sample_id": "a",\n "conversation": ')
    with pytest.raises(DataFormatError, match=r"broken.json: record line 2: .*invalid JSON"):
        load_conversations("locomo", path)


def test_longmemeval_published_format():
    convs = load_conversations("longmemeval", FIXTURES / "longmemeval_mini.json")
    assert [c.id for c in convs] == ["q_7f3a", "q_81bd"]
    first = convs[0]
    assert [t.id for t in first.turns] == [
        "sharegpt_x1:1",
        "sharegpt_x1:2",
        "answer_a9c2:1",
        "answer_a9c2:2",
        "answer_a9c2:3",
    ]
    assert [t.role for t in first.turns] == ["user", "assistant", "user", "assistant", "user"]
    assert first.turns[2].session_time == "2023-05-25T18:05"
    assert first.metadata["evidence_turns"] == ["answer_a9c2:1"]
    assert first.metadata["question_type"] == "single-session-user"
    assert convs[1].metadata["evidence_turns"] == ["answer_77aa:2"]


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda q: q["haystack_dates"].pop(), "haystack_sessions"),
        (lambda q: q["haystack_sessions"][1][0].update(role="system"), "haystack_sessions[1][0].role"),
        (lambda q: q["haystack_sessions"][0][1].pop("content"), "haystack_sessions[0][1].content"),
        (lambda q: q["haystack_dates"].__setitem__(0, "someday"), "haystack_dates[0]"),
    ],
)
def test_longmemeval_malformed(tmp_path, mutate, field):
    data = json.loads((FIXTURES / "longmemeval_mini.json").read_text())
    mutate(data[0])
    with pytest.raises(DataFormatError) as err:
        load_conversations("longmemeval", _write(tmp_path, data))
    assert (err.value.record, err.value.field) == ("0 (q_7f3a)", field)


def test_chat_jsonl():
    first, second = load_conversations("chat_jsonl", FIXTURES / "chats.jsonl")
    assert first.id == "chat-1"
    assert [(t.id, t.speaker, t.role, t.session_id, t.session_time) for t in first.turns] == [
        ("S1:1", "Ann", "user", "a", "2024-03-01T09:00"),
        ("S1:2", "assistant", "assistant", "a", "2024-03-01T09:00"),
        ("S2:1", "Ann", "user", "b", "2024-03-08T18:30"),
    ]
    assert first.turns[2].text == "I start at the bakery on Monday."  # content parts joined
    assert second.id == "chats-3"  # file stem and line number when no id
    assert second.turns[0].session_time == "2024-03-01T08:00"  # epoch seconds, UTC


@pytest.mark.parametrize(
    "line,field",
    [
        ('{"messages": [{"role": "user"}]}', "messages[0].content"),
        ('{"messages": [{"role": "narrator", "content": "x"}]}', "messages[0].role"),
        ('{"messages": "hello"}', "messages"),
        ('{"messages": [{"role": "system", "content": "only instructions"}]}', "messages"),
        (
            '{"messages": [{"role": "user", "content": "x", "timestamp": "tomorrow"}]}',
            "messages[0].timestamp",
        ),
        ('{"messages": [', "<line>"),
    ],
)
def test_chat_jsonl_malformed(tmp_path, line, field):
    path = tmp_path / "chats.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "fine"}]}\n' + line + "\n")
    with pytest.raises(DataFormatError) as err:
        load_conversations("chat_jsonl", path)
    assert (err.value.record, err.value.field) == ("line 2", field)


def test_memorybank_real_file(memorybank_path):
    convs = load_conversations("memorybank", memorybank_path)
    assert len(convs) == 15
    emily = convs[0]
    assert emily.id == "Emily" and emily.speakers == ["Emily", "assistant"]
    assert (emily.turns[0].id, emily.turns[0].role, emily.turns[0].session_time) == (
        "S1:1",
        "user",
        "2023-04-27",
    )
    assert emily.turns[1].role == "assistant"
    assert [t.session_time for t in emily.turns] == sorted(t.session_time for t in emily.turns)
    assert emily.metadata["meta_information"]["name"] == "Emily"


def test_memorybank_malformed(tmp_path):
    path = _write(tmp_path, {"Zed": {"name": "Zed", "history": {"2023-04-27": [{"query": "hi"}]}}})
    with pytest.raises(DataFormatError) as err:
        load_conversations("memorybank", path)
    assert (err.value.record, err.value.field) == ("Zed", "history.2023-04-27[0].response")


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        load_conversations("csv", tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_conversations("locomo", tmp_path / "missing.json")


def test_conversation_messages_read_back_as_the_same_dialogue():
    from dimmem.contract.loaders import conversation_from_messages, conversation_messages
    from dimmem.contract.loaders._fields import Record
    from dimmem.contract.toyworld import generate_dialogue

    original = generate_dialogue(3, seed=0).conversation
    back = conversation_from_messages(
        {"messages": conversation_messages(original), "id": original.id},
        Record("messages", "test"),
        original.id,
    )
    assert [(t.speaker, t.text, t.session_id, t.session_time) for t in back.turns] == [
        (t.speaker, t.text, t.session_id, t.session_time) for t in original.turns
    ]
