"""The DimMem authors' format at the edges: their SFT rows imported into this project's dataset and
exported back, their prompt and answer spoken to a served extractor, and the contamination check.
Fixtures (tests/fixtures/paper/) are rows written by hand in their layout."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from datagen_helpers import mock_client

from data_gen.cli import main as datagen_main
from data_gen.overlap import check_overlap, train_conversations
from data_gen.paper_dataset import template_of
from devtools.fake_teacher import FakeTeacher
from dimmem.contract.conversation import Conversation, Turn
from dimmem.contract.formats import extract_format
from dimmem.contract.loaders.locomo import load_locomo
from dimmem.contract.paper_format import read_lines
from dimmem.contract.records import memory_record
from dimmem.contract.validate import validate
from dimmem.contract.windows import make_windows
from dimmem.llm import ModelClient, ModelConfig
from dimmem.runtime.extractors import EndpointExtractor, keep_valid

FIXTURES = Path(__file__).parent / "fixtures" / "paper"
PAPER = extract_format("dimmem-paper")
USER_ONLY = extract_format("dimmem-paper-longmemeval")


def rows_of(path: Path) -> dict[tuple[str, int], dict]:
    rows = [json.loads(line) for line in path.open(encoding="utf-8")]
    return {(r["metadata"]["conv_name"], r["metadata"]["window"]): r for r in rows}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("imported")
    args = ["import", str(FIXTURES / "train.jsonl"), "--out", str(out), "--validation", "0.25"]
    assert datagen_main([*args, "--test", "0.25", "--teacher-model", "gpt-5.4", "--quiet"]) == 0
    return out


# ---- import ----------------------------------------------------------------------------------------------
def test_import_writes_the_datagen_outputs_with_every_bad_row_quarantined_for_its_reason(imported):
    report = json.loads((imported / "report.json").read_text())
    assert (report["rows"], report["labeled"], report["quarantined"]) == (12, 7, 5)
    assert report["format"] == "dimmem-paper" and report["memories"] == 12
    reasons = {
        r["conversation_id"]: r["reason"] for r in map(json.loads, (imported / "quarantine.jsonl").open())
    }
    assert reasons["Bad-conv9_v0"] == "train[7]: no `messages`"
    assert "holds no JSON object" in reasons["Bad-conv9_v1"]
    assert "line 1 is not a message" in reasons["Bad-conv9_v2"]
    assert "['message 0'] not in the input" in reasons["Bad-conv9_v3"]  # source_id 0
    assert "['message 5'] not in the input" in reasons["Bad-conv9_v3"]  # beyond the window
    assert "[source_turns_overlap]" in reasons["Bad-conv9_v4"] and "[time_format]" in reasons["Bad-conv9_v4"]
    assert report["rules_broken"] == {
        "source_turns_unknown": 2,
        "json": 1,
        "source_turns_overlap": 1,
        "time_format": 1,
    }
    for name in ("dataset", "labels.jsonl", "jobs.jsonl", "README.md"):
        assert (imported / name).exists()


def test_imported_memories_are_contract_records(imported):
    labels = {r["window_id"]: r for r in map(json.loads, (imported / "labels.jsonl").open(encoding="utf-8"))}
    first = labels["Ravi-conv7_v0/w0000"]["value"]["memories"]
    assert first[1] == memory_record(  # their "" time and dimensions are null in the contract
        source_turns=["t3"],
        speaker="Ravi",
        content="Ravi works with spreadsheets all day.",
        type="fact",
        keywords=["Ravi", "spreadsheets", "job"],
    )
    # the second window's context (messages 1-2) is stated by its system message; message 4 is t4
    second = labels["Ravi-conv7_v0/w0001"]
    assert [m["source_turns"] for m in second["value"]["memories"]] == [["t3"], ["t4"]]
    assert second["memories"][1]["source_turns"] == ["2024-03-09T18:30:01.500000"]  # a turn id per message
    # Chinese, and a second window whose context is found from the previous window's lines
    chinese = labels["Mei-conv12_v0/w0001"]["value"]["memories"][0]
    assert chinese["speaker"] == "志强" and chinese["keywords"] == ["志强", "吉他", "练习"]
    assert chinese["source_turns"] == ["t2"] and chinese["type"] == "profile"


def test_import_splits_by_template_and_its_card_names_source_license_and_contamination(imported):
    from datasets import load_from_disk

    dataset = load_from_disk(str(imported / "dataset"))
    templates = {split: {template_of(c) for c in ds["conversation_id"]} for split, ds in dataset.items()}
    assert sum(map(len, templates.values())) == len(set().union(*templates.values())) == 4
    conv7 = [split for split, ds in dataset.items() if "Tomas-conv7_v1" in ds["conversation_id"]]
    assert conv7 and "Ravi-conv7_v0" in dataset[conv7[0]]["conversation_id"]  # variants stay together
    row = next(r for ds in dataset.values() for r in ds if r["window_id"] == "Ravi-conv7_v0/w0001")
    assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
    assert "## Context" in row["messages"][1]["content"]  # this project's prompt, rendered from the window
    assert json.loads(row["messages"][2]["content"])["memories"][0]["source_turns"] == ["t3"]
    card = (imported / "README.md").read_text()
    assert "train.jsonl" in card and "gpt-5.4" in card and "Contamination" in card and "check-overlap" in card


def test_chinese_rows_train_as_they_read(imported, qwen3_tokenizer):
    """A Chinese window through the target tokenizer: the rendered training text keeps every character
    of the prompt and the answer (no unknown tokens), and its keywords pass the validator."""
    from datasets import load_from_disk

    from dimmem.contract.tokens import render_prompt

    dataset = load_from_disk(str(imported / "dataset"))
    row = next(r for ds in dataset.values() for r in ds if r["window_id"] == "Mei-conv12_v0/w0001")
    text = render_prompt(qwen3_tokenizer, row["messages"][:-1]) + row["messages"][-1]["content"]
    ids = qwen3_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert qwen3_tokenizer.decode(ids) == text and "志强最近开始学吉他" in text
    assert qwen3_tokenizer.unk_token_id not in ids


def _tomas() -> dict:
    return rows_of(FIXTURES / "train.jsonl")[("Tomas-conv7_v1", 0)]


def _with_lines(row: dict, edit) -> dict:
    lines = row["messages"][1]["content"].splitlines()
    row["messages"][1]["content"] = "\n".join(edit(lines))
    return row


def _second_window(row: dict, system: str) -> dict:
    """Window 1 of the same conversation: its last line repeated as context, one new line."""
    lines = row["messages"][1]["content"].splitlines()
    new = "[2023-07-14T09:15:01.500000, Fri] 2.Ines: She is lovely."
    second = json.loads(json.dumps(row))
    second["messages"][0]["content"] = system
    second["messages"][1]["content"] = lines[-1].replace("] 3.", "] 1.") + "\n" + new
    second["messages"][2]["content"] = '{"memories": []}'
    second["metadata"]["window"] = 1
    return second


def _two_user_messages(r):
    return [{**r, "messages": [*r["messages"], r["messages"][1]]}]


def _content_in_parts(r):
    return [{**r, "messages": [r["messages"][0], {"role": "user", "content": ["parts"]}]}]


def _zoned(r):
    return [_with_lines(r, lambda ls: [ls[0].replace(":00,", ":00+02:00,", 1), *ls[1:]])]


def _out_of_order(r):
    swap = lambda ls: [ls[0], ls[2].replace("] 3.", "] 2."), ls[1].replace("] 2.", "] 3.")]  # noqa: E731
    return [_with_lines(r, swap)]


def _broken_last_line(r):
    return [_with_lines(r, lambda ls: [*ls, "[broken line"])]


def _context_agrees(r):
    return [r, _second_window(r, "Messages 1-1 are context.")]


def _context_contradicted(r):
    return [r, _second_window(r, "Messages 1-2 are context.")]


def _two_messages_one_time(r):
    edit = lambda ls: [ls[0].replace("Yes,", "No,"), ls[1]]  # noqa: E731
    return [r, _with_lines(_second_window(r, "x"), edit)]


@pytest.mark.parametrize(
    "rows, reason",
    [
        (_two_user_messages, "2 user messages, expected one"),
        (_content_in_parts, "messages[1] is not a {role, content} pair"),
        (_zoned, "has a time zone"),
        (_out_of_order, "is not after the line before"),
        (_broken_last_line, "line 4 is not a message"),
        (_context_agrees, None),
        (_context_contradicted, "says 2 context messages, but the window repeats 1"),
        (_two_messages_one_time, "a different message at 2023-07-14T09:15:01"),
    ],
)
def test_rows_that_would_mislead_are_quarantined_with_their_reason(tmp_path, capsys, rows, reason):
    path = tmp_path / "rows.jsonl"
    written = rows(_tomas())
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in written), encoding="utf-8")
    code = datagen_main(["import", str(path), "--out", str(tmp_path / "o"), "--quiet"])
    if code != 0:  # no row at all in their layout: one error naming the row's problem, nothing written
        assert len(written) == 1 and not (tmp_path / "o").exists()
        assert reason in capsys.readouterr().err
        return
    quarantine = [json.loads(line) for line in (tmp_path / "o" / "quarantine.jsonl").open()]
    if reason is None:  # the stated context agrees with the lines repeated: both windows kept
        assert not quarantine
    else:
        assert any(reason in q["reason"] for q in quarantine), quarantine


def test_rows_without_window_numbers_are_read_in_file_order(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "train.jsonl").open(encoding="utf-8")][:7]
    for row in rows:
        del row["metadata"]["window"]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert datagen_main(["import", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert (report["labeled"], report["quarantined"]) == (7, 0)


@pytest.mark.parametrize(
    "system, context",
    [
        ("Messages 1-5 are context from the previous window; extract from 6-25.", 5),
        ("messages 1..3 are context only", 3),
        ("The first 2 messages are context.", 2),
        ("消息 1-4 为上下文，只从第 5 条起抽取。", 4),
        ("Every message is new: extract from messages 1-9.", 0),
        ("Extract memories.", None),  # not stated: the previous window's lines decide
    ],
)
def test_stated_context(system, context):
    from dimmem.contract.paper_format import stated_context

    assert stated_context(system) == context


def test_template_names():
    assert template_of("Amber-conv41_v8") == template_of("Ben-conv-41_v0") == "conv-41"
    assert template_of("lme-0042_v3") == "lme-0042"


def test_bad_sources_are_one_line(tmp_path, capsys):
    assert datagen_main(["import", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "not readable as a dataset" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": []}\n{not json\n')
    assert datagen_main(["import", str(broken), "--out", str(tmp_path / "o")]) == 2
    assert "broken.jsonl: not readable as a dataset" in capsys.readouterr().err
    other = tmp_path / "chats.jsonl"  # a dataset, but not theirs: nothing is written
    other.write_text('{"text": "hello"}\n{"text": "bye"}\n')
    assert datagen_main(["import", str(other), "--out", str(tmp_path / "o")]) == 2
    assert (
        "no row is a window in the DimMem authors' layout (train[0]: no `messages`)"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "o").exists()
    args = ["import", str(FIXTURES / "train.jsonl"), "--out", str(tmp_path / "o"), "--validation", "1.5"]
    assert datagen_main(args) == 2 and "validation" in capsys.readouterr().err


# ---- export and the round trip ----------------------------------------------------------------------------
def test_round_trip_their_rows_to_the_contract_and_back_is_lossless(imported, tmp_path):
    """Their format -> the contract -> their format: the lines (timestamps to the microsecond), the answer
    text (key order, indent 2) and the metadata come back as they were. The system message is this
    project's (their instruction text is not carried; it states the same context)."""
    out = tmp_path / "paper"
    assert datagen_main(["export", str(imported), "--format", "dimmem-paper", "--out", str(out)]) == 0
    original = rows_of(FIXTURES / "train.jsonl")
    exported = {}
    for split in ("train", "validation", "test"):
        if (out / f"{split}.jsonl").exists():
            exported |= rows_of(out / f"{split}.jsonl")
    assert len(exported) == 7
    for key, row in exported.items():
        assert row["messages"][1:] == original[key]["messages"][1:], key
        assert row["metadata"] == original[key]["metadata"]
        stated = "Messages 1-2 are context" if key == ("Ravi-conv7_v0", 1) else "Every message is new"
        assert stated in row["messages"][0]["content"] or key == ("Mei-conv12_v0", 1)
    # and it reads back through `datasets` as a Hub-layout folder, into the same labels
    again = tmp_path / "again"
    assert datagen_main(["import", str(out), "--out", str(again), "--quiet"]) == 0
    labels = lambda folder: sorted(  # noqa: E731
        json.dumps(r["value"]) for r in map(json.loads, (folder / "labels.jsonl").open(encoding="utf-8"))
    )
    assert labels(again) == labels(imported)


def test_the_longmemeval_variant_round_trips(tmp_path):
    out, paper = tmp_path / "in", tmp_path / "paper"
    assert datagen_main(["import", str(FIXTURES / "longmemeval.jsonl"), "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["format"] == "dimmem-paper-longmemeval" and report["labeled"] == 1
    from datasets import load_from_disk

    dataset = load_from_disk(str(out / "dataset"))  # one template: validation and test are empty splits
    assert (len(dataset["train"]), len(dataset["validation"]), len(dataset["test"])) == (1, 0, 0)
    # user lines 1 s apart (the assistant's turns between them are not shown) are still one session
    assert dataset["train"][0]["messages"][1]["content"].count("[session of") == 1
    assert (
        datagen_main(["export", str(out), "--format", "dimmem-paper-longmemeval", "--out", str(paper)]) == 0
    )
    (exported,) = [json.loads(line) for p in paper.glob("*.jsonl") for line in p.open(encoding="utf-8")]
    (original,) = rows_of(FIXTURES / "longmemeval.jsonl").values()
    assert exported["messages"][1:] == original["messages"][1:]


def test_what_their_format_cannot_carry_is_counted(tmp_path):
    """Several source turns: the first shown one is kept. The longmemeval variant shows user messages
    only: a memory citing an assistant turn has no number to cite there."""
    turns = [
        Turn("s1:1", "user", "user", "I moved to Oslo.", "s1", "2024-01-05T09:00"),
        Turn("s1:2", "assistant", "assistant", "Welcome to Oslo!", "s1", "2024-01-05T09:00"),
        Turn("s1:3", "user", "user", "I work at the harbour.", "s1", "2024-01-05T09:00"),
    ]
    (window,) = make_windows(Conversation("c", turns), 5, 1)
    memory = memory_record(speaker="user", content="x", type="fact", keywords=["Oslo"])
    answer = {"memories": [{**memory, "source_turns": ["t3", "t1"]}, {**memory, "source_turns": ["t2"]}]}
    paper, lost = USER_ONLY.from_contract(answer, window)
    assert lost == 1 and [m["source_id"] for m in paper["memories"]] == [1]  # the earliest shown: t1
    assert "source_speaker" not in paper["memories"][0]
    back = USER_ONLY.to_contract(paper, window)
    assert back["memories"][0]["source_turns"] == ["t1"] and validate("extract", back, window.scope).ok
    only_third = {"memories": [{**memory, "source_turns": ["t3"]}]}
    assert USER_ONLY.from_contract(only_third, window)[0]["memories"][0]["source_id"] == 2  # 2nd user line


# ---- the prompt, the schema and the answer ----------------------------------------------------------------
@pytest.fixture(scope="module")
def locomo_windows(locomo_path):
    conv = load_locomo(locomo_path)[0]
    return conv, make_windows(conv, 25, 5)


def test_prompt_numbers_every_line_and_states_the_context(locomo_windows):
    conv, windows = locomo_windows
    system, user = (m["content"] for m in PAPER.messages(windows[1]))
    assert "Messages 1-5 are context" in system and "messages 6-25" in system
    lines = user.splitlines()
    assert len(lines) == 25 and lines[0].split("] ")[1].startswith("1.") and " 25." in lines[-1]
    assert "Every message is new: extract from messages 1-25" in PAPER.messages(windows[0])[0]["content"]
    # timestamps: the session's time plus 0.5 s per message of the session, so every message of the
    # conversation has its own, and reading the lines back gives the turns again
    seen = {}
    for w in windows:
        for turn, read in zip(w.turns, read_lines(PAPER.messages(w)[1]["content"])):
            assert (turn.speaker, turn.text) == (read.speaker, read.text)
            assert seen.setdefault(turn.id, read.id) == read.id
    assert len(set(seen.values())) == len(conv.turns)


def test_schema_allows_only_the_new_messages_of_each_speaker(locomo_windows):
    _, windows = locomo_windows
    w = windows[1]
    schema = PAPER.response_format(w)["json_schema"]["schema"]
    variants = schema["properties"]["memories"]["items"]["anyOf"]
    allowed = {
        v["properties"]["source_speaker"]["enum"][0]: v["properties"]["source_id"]["enum"] for v in variants
    }
    lines = PAPER.messages(w)[1]["content"].splitlines()
    for speaker, numbers in allowed.items():
        assert min(numbers) >= 6 and all(f"] {n}.{speaker}:" in lines[n - 1] for n in numbers)
    dimension = {
        "memory_type": "fact",
        "time": "",
        "location": "",
        "reason": "",
        "purpose": "",
        "keywords": [],
    }
    speaker, numbers = next(iter(allowed.items()))
    good = {
        "memories": [
            {"source_id": numbers[0], "source_speaker": speaker, "content": "c", "dimension": dimension}
        ]
    }
    jsonschema.validate(good, schema)
    for bad in ({"source_id": 1}, {"source_speaker": "Someone"}, {"extra": 1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"memories": [{**good["memories"][0], **bad}]}, schema)


@pytest.mark.parametrize(
    "text",
    [
        '<think>let me see</think>\n```json\n{"memories": []}\n```',
        'Here you go: {"memories": []} and nothing else',
    ],
)
def test_their_parser_leniency(text):
    assert PAPER.decode(text) == {"memories": []}


def test_a_fence_inside_the_answer_is_content():
    text = '```json\n{"memories": [{"content": "Ann writes ```json fences"}]}\n```'
    assert PAPER.decode(text) == {"memories": [{"content": "Ann writes ```json fences"}]}


def test_answers_map_onto_the_contract_and_its_validator_names_what_is_wrong(locomo_windows):
    _, windows = locomo_windows
    w = windows[1]
    dimension = {"memory_type": "episodic", "time": "2023-05", "location": "", "reason": "", "purpose": ""}

    def memory(source_id, **extra):
        return {
            "source_id": source_id,
            "content": "c",
            "dimension": {**dimension, "keywords": ["k"]},
            **extra,
        }

    speaker = w.turns[5].speaker
    answer = {
        "memories": [memory(6, source_speaker=speaker), memory(2), memory("6"), memory(True), memory(26)]
    }
    contract = PAPER.to_contract(json.dumps(answer), w)
    assert contract["memories"][0]["source_turns"] == ["t6"] and contract["memories"][0]["location"] is None
    kept = keep_valid(w, contract)
    assert len(kept.records) == 1 and kept.records[0]["source_turns"] == [w.turns[5].id]
    rules = {(i.index, i.rule) for i in kept.issues}
    assert (1, "source_turns_overlap") in rules  # message 2 is context
    assert {(2, "source_turns_unknown"), (3, "source_turns_unknown"), (4, "source_turns_unknown")} <= rules
    assert PAPER.to_contract("no json here", w) == "no json here"


# ---- served: the fake teacher, and the runtime and eval through it -----------------------------------------
def test_memory_runtime_over_an_extractor_that_speaks_their_format(memory_factory, embedder):
    fake = FakeTeacher()
    config = ModelConfig(base_url="http://fake.test/v1", model="dimmem-4b", max_retries=0)
    client = ModelClient(config, http_client=mock_client(fake, sync=True))
    memory = memory_factory(
        {"windows": {"window": 2, "overlap": 1}},
        embedder=embedder,
        extractor=EndpointExtractor(client, concurrency=2, fmt=PAPER),
    )
    messages = [
        {"role": "user", "content": "I adopted a beagle called Biscuit.", "created_at": "2024-03-04"},
        {"role": "assistant", "content": "Lovely name!", "created_at": "2024-03-04"},
        {"role": "user", "content": "I also run on Sundays.", "created_at": "2024-03-04"},
    ]
    result = memory.add(messages, user_id="ann", conversation_id="chat-1")
    assert result.windows == 2 and not result.failed and not result.rejected
    stored = memory.store.records("ann")
    assert [r["source_turns"] for r in stored] == [["S1:1"], ["S1:3"]]
    # the second window: message 1 is context, so only message 2 may be cited
    body = next(b for b in fake.bodies if "Messages 1-1 are context" in b["messages"][0]["content"])
    assert body["response_format"]["json_schema"]["name"] == "dimmem_paper"
    assert body["messages"][1]["content"].splitlines()[1].split("] ")[1].startswith("2.user: I also run")
    items = body["response_format"]["json_schema"]["schema"]["properties"]["memories"]["items"]["anyOf"]
    assert [v["properties"]["source_id"]["enum"] for v in items] == [[2]]


def test_a_window_showing_no_new_message_is_not_asked():
    """The LongMemEval variant shows user messages only: a window whose new part is the assistant's has
    nothing to cite, so no request is sent (the endpoint here does not exist) and no memory comes back."""
    turns = [
        Turn("s1:1", "user", "user", "Any tips for Oslo?", "s1", "2024-01-05T09:00"),
        Turn("s1:2", "assistant", "assistant", "Visit the Munch museum.", "s1", "2024-01-05T09:00"),
    ]
    windows = make_windows(Conversation("c", turns), 1, 0)
    config = ModelConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0, timeout=1)
    answers = EndpointExtractor(ModelClient(config), fmt=USER_ONLY)(windows[1:])
    assert answers == {windows[1].id: {"memories": []}}


def test_memory_config_selects_the_format():
    from dimmem.runtime.config import MemoryConfig

    cfg = MemoryConfig(
        extractor="model", extractor_format="dimmem-paper", model={"model": "m", "base_url": "x"}
    )
    assert cfg.build_extractor().fmt is PAPER
    with pytest.raises(ValueError, match="extractor_format"):
        MemoryConfig(extractor_format="paper")


@pytest.mark.integration
def test_eval_locomo_scores_an_endpoint_in_their_format(tmp_path):
    from datagen_helpers import FakeServer

    from eval.cli import main as eval_main

    out = tmp_path / "paper"
    fixed = ["--set", "locomo.thresholds.cosine=0.95", "--set", "locomo.thresholds.token_f1=0.95"]
    with FakeServer(tmp_path) as fake:
        args = ["extraction", "--benchmark", "locomo", "--conversations", "conv-26", "--model", "dimmem-4b"]
        args += ["--base-url", f"http://127.0.0.1:{fake.port}/v1", "--extractor-format", "dimmem-paper"]
        assert eval_main([*args, "--out", str(out), *fixed]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["windows"] == 21 and metrics["parse_rate"] == 1.0 and metrics["records"] == 21
    assert metrics["run"]["extractor_format"] == "dimmem-paper"
    prediction = json.loads((out / "predictions.jsonl").open().readline())
    assert json.loads(prediction["raw"])["memories"][0]["dimension"]["memory_type"] == "fact"
    assert json.loads(prediction["output"])["memories"][0]["type"] == "fact"


def test_eval_a_local_model_in_their_format_against_a_datagen_split(toy_dataset, random_tiny_model, tmp_path):
    """`--hf-model` with `--extractor-format`: prompts rendered from the split's windows (jobs.jsonl) in
    their layout; the random model writes no JSON, so every window is scored unparsed, its text kept."""
    from eval.cli import main as eval_main

    out = tmp_path / "hf"
    args = ["extraction", "--references", f"{toy_dataset}:test", "--hf-model", str(random_tiny_model)]
    args += ["--extractor-format", "dimmem-paper", "--max-tokens", "8", "--limit", "2", "--out", str(out)]
    assert eval_main(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["windows"] == 2 and metrics["parse_rate"] == 0.0
    assert metrics["run"]["extractor_format"] == "dimmem-paper"
    rows = [json.loads(line) for line in (out / "predictions.jsonl").open()]
    assert all(r["raw"] == r["output"] for r in rows)  # text without a JSON object stays as it was
    # a dataset folder alone has no windows to render their prompts from: one line says so
    import shutil

    from eval.extraction import attach_windows, load_references

    shutil.copytree(toy_dataset / "dataset", tmp_path / "alone" / "dataset")
    spec = f"{tmp_path / 'alone'}:test"
    with pytest.raises(ValueError, match="jobs.jsonl"):
        attach_windows(load_references(spec, 1), spec)


def test_eval_refuses_a_format_for_stored_answers(tmp_path, capsys):
    from eval.cli import main as eval_main

    args = [
        "extraction",
        "--benchmark",
        "locomo",
        "--extractor",
        "turns",
        "--extractor-format",
        "dimmem-paper",
    ]
    assert eval_main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "is what a model speaks" in capsys.readouterr().err


# ---- contamination ----------------------------------------------------------------------------------------
def _template_variant(conv: Conversation, keep_text: bool) -> Conversation:
    """What the authors' generator does to a LoCoMo conversation: new names and dates (shifted by the
    same amount, so the gaps stay), the same message count and order; with `keep_text` the words too."""
    from datetime import datetime, timedelta

    names = dict(zip(conv.speakers, ("Iris", "Omar")))
    shift = lambda t: (datetime.fromisoformat(t) + timedelta(days=400)).isoformat(timespec="minutes")  # noqa: E731
    turns = [
        replace(
            t,
            speaker=names[t.speaker],
            text=t.text if keep_text else f"{names[t.speaker]} talks about their garden, item {i}.",
            session_time=shift(t.session_time),
        )
        for i, t in enumerate(conv.turns)
    ]
    return Conversation(f"Iris-conv{conv.id.split('-')[1]}_v0", turns)


def _write_rows(conversations: list[Conversation], path: Path) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for conv in conversations:
            for w in make_windows(conv, 25, 5):
                row = {"messages": [*PAPER.messages(w), {"role": "assistant", "content": '{"memories": []}'}]}
                row["metadata"] = {"conv_name": conv.id, "window": w.index, "n_memories": 0}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def test_check_overlap_flags_a_template_of_a_test_conversation_and_not_the_toy_world(locomo_path, tmp_path):
    from dimmem.contract.toyworld import generate_world

    locomo = load_locomo(locomo_path)
    toy = {d.conversation.id: d.conversation.turns for d in generate_world(6, 0, 4, 3)}
    assert not any(r.flagged for r in check_overlap(toy, locomo))

    rows = _write_rows([_template_variant(locomo[0], keep_text=False)], tmp_path / "template.jsonl")
    result = {r.conversation: r for r in check_overlap(train_conversations(str(rows)), locomo)}
    flagged = [c for c, r in result.items() if r.flagged]
    assert flagged == [locomo[0].id] and result[locomo[0].id].structure == 1.0
    assert result[locomo[0].id].exact == result[locomo[0].id].near == 0  # no sentence shared

    copied = _write_rows([_template_variant(locomo[1], keep_text=True)], tmp_path / "copied.jsonl")
    out = tmp_path / "overlap.json"
    args = ["check-overlap", "--train", str(copied), "--eval", "locomo", "--eval-input", str(locomo_path)]
    assert datagen_main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["flagged"] == [locomo[1].id]
    shared = next(c for c in report["conversations"] if c["conversation"] == locomo[1].id)
    assert shared["exact"] > 0.8 * shared["turns"]
