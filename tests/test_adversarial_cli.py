"""The standing adversarial suite, command-line part: malformed input to every subcommand —
missing files, broken, empty and non-mapping YAML, unknown keys, wrong types, bad flag values — must
end with exit status 2 and one line on stderr that names the file (and line) or the endpoint, never a
traceback. The matrix runs in process through `dimmem.cli.main` (an exception escaping it fails the
test); the cases the issue found as tracebacks also run as users run them, `python -m dimmem` in a
subprocess (integration). Hub pushes without a network or a token, a teacher endpoint that does not
answer and a training recipe that needs a GPU are here too."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from dimmem.cli import main
from dimmem.launch import free_port
from dimmem.paths import CONFIG_DIR, GGUF_SETTINGS_KEY, shared_data_dir

LOCOMO = shared_data_dir() / "locomo" / "locomo10.json"
BROKEN = "a: [1, 2\nb: c\n"  # a flow sequence never closed: PyYAML stops on line 2


def write(folder: Path, name: str, content) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


@pytest.fixture
def d(tmp_path) -> Path:
    """A folder of bad inputs, named as the cases below use them."""
    write(tmp_path, "broken.yaml", BROKEN)
    write(tmp_path, "empty.yaml", "")
    write(tmp_path, "list.yaml", "- 1\n- 2\n")
    write(
        tmp_path, "datagen-unknown.yaml", {"source": {"format": "toy"}, "out": "o", "teacher": {"bogus": 1}}
    )
    write(
        tmp_path, "datagen-type.yaml", {"source": {"format": "toy"}, "out": "o", "teacher": {"rpm": "fast"}}
    )
    write(tmp_path, "datagen-locomo.yaml", {"source": {"format": "locomo", "input": "nope.json"}, "out": "o"})
    write(tmp_path, "windows-unknown.yaml", {"formats": {"locomo": {"window": 5, "overlap": 1, "stride": 2}}})
    write(tmp_path, "windows-type.yaml", {"max_tokens": "lots"})
    write(tmp_path, "train-unknown.yaml", {"dataset_path": "x", "bf16": False, "learning_rat": 1e-4})
    write(tmp_path, "train-type.yaml", {"dataset_path": "x", "bf16": False, "learning_rate": "fast"})
    write(tmp_path, "eval-unknown.yaml", {"references": "r", "out": "o", "predictions": "p", "colour": 1})
    write(tmp_path, "eval-type.yaml", {"references": "r", "out": "o", "predictions": "p", "limit": "all"})
    write(
        tmp_path,
        "eval-two-sources.yaml",
        {"references": "r", "out": "o", "predictions": "p", "hf_model": "m"},
    )
    write(tmp_path, "memory-unknown.yaml", {"retrieval": {"dept": 3}})
    write(tmp_path, "serve-unknown.yaml", {"tenants": {}, "colour": 1})
    write(tmp_path, "not-json.json", "{this is not json")
    write(tmp_path, "labels-missing-key.jsonl", json.dumps({"task": "extract", "window_id": "c/w0"}) + "\n")
    row = {"task": "extract", "conversation_id": "c", "window_id": "c/w0000"}
    write(tmp_path, "labels-ok.jsonl", "\n" + json.dumps({**row, "memories": []}) + "\n\n")
    write(tmp_path, "labels-null.jsonl", json.dumps({**row, "memories": None}) + "\n")
    write(tmp_path, "labels-array.jsonl", json.dumps([{"conversation_id": "c"}]) + "\n")
    write(tmp_path, "labels-not-json.jsonl", "{oops\n")
    (tmp_path / "a-folder").mkdir()
    return tmp_path


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    """`dimmem ARGV` in process: (exit status, stderr). argparse's usage errors exit by SystemExit."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_one_line(code, err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, f"exit {code}:\n{err}"
    line = lines[0]
    assert line.startswith("dimmem") and "error" in line, line
    for needle in needles:
        assert needle in line, f"{needle!r} not in: {line}"
    return line


# (argv with {d} for the bad-input folder, what the one line must name)
CASES = {
    # dimmem windows
    "windows-missing-config": (
        "windows --config {d}/nope.yaml --format locomo --input x",
        ["nope.yaml", "no such config"],
    ),
    "windows-broken-yaml": (
        "windows --config {d}/broken.yaml --format locomo --input x",
        ["broken.yaml", "line 2"],
    ),
    "windows-empty-yaml": (
        "windows --config {d}/empty.yaml --format locomo --input x",
        ["empty.yaml", "--window"],
    ),
    "windows-list-yaml": (
        "windows --config {d}/list.yaml --format locomo --input x",
        ["list.yaml", "mapping"],
    ),
    "windows-unknown-key": (
        "windows --config {d}/windows-unknown.yaml --format locomo --input x",
        ["windows-unknown.yaml", "unknown key 'formats.locomo.stride'"],
    ),
    "windows-wrong-type": (
        "windows --config {d}/windows-type.yaml --format locomo --input x",
        ["windows-type.yaml", "max_tokens"],
    ),
    "windows-missing-input": ("windows --format locomo --input {d}/nope.json", ["nope.json"]),
    "windows-input-not-json": ("windows --format locomo --input {d}/not-json.json", ["not-json.json"]),
    "windows-input-is-folder": ("windows --format locomo --input {d}/a-folder", ["a-folder: a folder"]),
    "windows-unknown-format": ("windows --format nope --input {d}/not-json.json", ["nope"]),
    "windows-window-0": (
        "windows --format locomo --input x --window 0 --overlap 0",
        ["windows.yaml with the flags: window: Input should be greater than or equal to 1"],
    ),
    "windows-window-negative": ("windows --format locomo --input x --window -3 --overlap 0", ["window"]),
    "windows-overlap-negative": ("windows --format locomo --input x --window 5 --overlap -1", ["overlap"]),
    "windows-overlap-equals-window": (
        "windows --format locomo --input x --window 5 --overlap 5",
        ["overlap (5) must be smaller than window (5)"],
    ),
    "windows-overlap-above-window": (
        "windows --format locomo --input x --window 5 --overlap 9",
        ["overlap (9) must be smaller than window (5)"],
    ),
    "windows-max-tokens-negative": ("windows --format locomo --input x --max-tokens -5", ["max_tokens"]),
    "windows-window-not-int": ("windows --format locomo --input x --window many", ["--window", "'many'"]),
    "windows-bad-set": ("windows --format locomo --input x --set formats.locomo.window", ["KEY=VALUE"]),
    "windows-missing-flags": ("windows", ["--format", "--input"]),
    # dimmem datagen
    "datagen-missing-config": ("datagen --config {d}/nope.yaml", ["nope.yaml", "no such config"]),
    "datagen-broken-yaml": ("datagen --config {d}/broken.yaml", ["broken.yaml", "line 2", "invalid YAML"]),
    "datagen-empty-yaml": ("datagen --config {d}/empty.yaml", ["empty.yaml", "missing key 'source'"]),
    "datagen-list-yaml": ("datagen --config {d}/list.yaml", ["list.yaml", "mapping"]),
    "datagen-unknown-key": ("datagen --config {d}/datagen-unknown.yaml", ["unknown key 'teacher.bogus'"]),
    "datagen-wrong-type": ("datagen --config {d}/datagen-type.yaml", ["datagen-type.yaml", "teacher.rpm"]),
    "datagen-unknown-set-key": (
        "datagen --config {d}/datagen-unknown.yaml --set teacher.bogus",
        ["KEY=VALUE"],
    ),
    "datagen-window-0": (
        f"datagen --config {CONFIG_DIR}/datagen/toy.yaml --out {{d}}/o --window 0",
        ["toy.yaml", "windows.window: Input should be greater than or equal to 1"],
    ),
    "datagen-overlap-too-big": (
        f"datagen --config {CONFIG_DIR}/datagen/toy.yaml --out {{d}}/o --window 4 --overlap 4",
        ["overlap (4) must be smaller than window (4)"],
    ),
    "datagen-concurrency-0": (
        f"datagen --config {CONFIG_DIR}/datagen/toy.yaml --out {{d}}/o --concurrency 0",
        ["teacher.concurrency"],
    ),
    "datagen-limit-not-int": (f"datagen --config {CONFIG_DIR}/datagen/toy.yaml --limit ten", ["--limit"]),
    "datagen-bad-teacher": (
        f"datagen --config {CONFIG_DIR}/datagen/toy.yaml --teacher claude",
        ["--teacher"],
    ),
    "datagen-unknown-format": (
        f"datagen --config {CONFIG_DIR}/datagen/toy.yaml --out {{d}}/o --format nope",
        ["unknown source format 'nope'"],
    ),
    "datagen-missing-input": ("datagen --config {d}/datagen-locomo.yaml --out {d}/o", ["nope.json"]),
    "datagen-no-config": ("datagen", ["--config"]),
    "datagen-push-only-without-repo": ("datagen --push-only {d}/a-folder", ["--push-to-hub"]),
    "datagen-push-only-not-an-output": (
        "datagen --push-only {d}/a-folder --push-to-hub me/x",
        ["a-folder", "not a datagen output"],
    ),
    "datagen-bad-repo-id": (
        f"datagen --config {CONFIG_DIR}/datagen/toy.yaml --out {{d}}/o --push-to-hub me/not//valid",
        ["--push-to-hub me/not//valid"],
    ),
    # dimmem train (TRL's parser)
    "train-missing-config": ("train --config {d}/nope.yaml", ["nope.yaml", "no such config"]),
    "train-broken-yaml": ("train --config {d}/broken.yaml", ["broken.yaml", "line 2", "invalid YAML"]),
    "train-empty-yaml": ("train --config {d}/empty.yaml", ["empty.yaml", "empty config", "tiny.yaml"]),
    "train-list-yaml": ("train --config {d}/list.yaml", ["list.yaml", "mapping"]),
    "train-config-without-file": ("train --config", ["--config needs a file"]),
    "train-unknown-key": ("train --config {d}/train-unknown.yaml", ["train-unknown.yaml", "'learning_rat'"]),
    "train-wrong-type": (
        "train --config {d}/train-type.yaml",
        ["--learning_rate", "'fast'", "train-type.yaml"],
    ),
    "train-bad-flag-value": (
        f"train --config {CONFIG_DIR}/train/tiny.yaml --max_steps many",
        ["--max_steps", "'many'"],
    ),
    "train-unknown-flag": (f"train --config {CONFIG_DIR}/train/tiny.yaml --stepz 3", ["--stepz"]),
    "train-no-dataset": ("train", ["--dataset_path"]),
    "train-missing-dataset": (
        f"train --config {CONFIG_DIR}/train/tiny.yaml --dataset_path {{d}}/nope",
        ["nope", "not a datagen output"],
    ),
    # dimmem export
    "export-nothing": ("export", ["--run", "--out"]),
    "export-missing-run": ("export --run {d}/nope --out {d}/x", ["nope: not a training run"]),
    "export-run-not-a-run": ("export --run {d}/a-folder --out {d}/x", ["a-folder: not a training run"]),
    "export-checkpoint-not-int": (
        "export --run {d}/a-folder --out {d}/x --checkpoint last",
        ["--checkpoint"],
    ),
    "export-push-only-without-repo": ("export --push-only {d}/a-folder", ["--push-to-hub"]),
    "export-push-only-not-an-export": (
        "export --push-only {d}/a-folder --push-to-hub me/x",
        ["a-folder", "not an export folder"],
    ),
    "export-bad-repo-id": (
        "export --run {d}/a-folder --out {d}/x --push-to-hub me/not//valid",
        ["--push-to-hub me/not//valid"],
    ),
    # dimmem eval
    "eval-no-subcommand": ("eval", ["required"]),
    "eval-extraction-missing-config": ("eval extraction --config {d}/nope.yaml", ["nope.yaml"]),
    "eval-extraction-broken-yaml": ("eval extraction --config {d}/broken.yaml", ["broken.yaml", "line 2"]),
    "eval-extraction-empty-yaml": ("eval extraction --config {d}/empty.yaml", ["empty.yaml", "references"]),
    "eval-extraction-unknown-key": (
        "eval extraction --config {d}/eval-unknown.yaml",
        ["unknown key 'colour'"],
    ),
    "eval-extraction-wrong-type": (
        "eval extraction --config {d}/eval-type.yaml",
        ["eval-type.yaml", "limit"],
    ),
    "eval-extraction-two-sources": (
        "eval extraction --config {d}/eval-two-sources.yaml",
        ["exactly one answer source"],
    ),
    "eval-extraction-no-source": (
        "eval extraction --references r --out {d}/o",
        ["exactly one answer source"],
    ),
    "eval-extraction-missing-references": (
        "eval extraction --references {d}/nope --out {d}/o --predictions p.jsonl",
        ["nope"],
    ),
    "eval-extraction-max-tokens-0": (
        "eval extraction --references r --out {d}/o --predictions p --max-tokens 0",
        ["max_tokens"],
    ),
    "eval-extraction-bad-flag": ("eval extraction --limit all", ["--limit"]),
    "eval-qa-missing-config": ("eval qa --config {d}/nope.yaml", ["nope.yaml"]),
    "eval-qa-broken-yaml": ("eval qa --config {d}/broken.yaml", ["broken.yaml", "line 2"]),
    "eval-qa-empty-yaml": ("eval qa --config {d}/empty.yaml", ["empty.yaml", "benchmark"]),
    "eval-qa-bad-benchmark": ("eval qa --benchmark trivia", ["--benchmark"]),
    "eval-qa-bad-categories": ("eval qa --categories one,two", ["--categories"]),
    "eval-retrieval-broken-yaml": ("eval retrieval --config {d}/broken.yaml", ["broken.yaml", "line 2"]),
    "eval-retrieval-empty-yaml": ("eval retrieval --config {d}/empty.yaml", ["empty.yaml", "input"]),
    "eval-retrieval-bad-k": ("eval retrieval --input x --k 5,ten", ["--k"]),
    "eval-retrieval-missing-input": ("eval retrieval --input {d}/nope.json", ["nope.json"]),
    "eval-compare-missing-runs": ("eval compare {d}/nope-a {d}/nope-b", ["nope-a: not an evaluation run"]),
    "eval-compare-not-runs": ("eval compare {d}/a-folder {d}/a-folder", ["a-folder"]),
    "eval-compare-one-run": ("eval compare {d}/a-folder", ["run_b"]),
    # dimmem memory
    "memory-add-missing-input": ("memory add --format locomo --input {d}/nope.json", ["nope.json"]),
    "memory-add-bad-format": ("memory add --format nope --input {d}/not-json.json", ["nope"]),
    "memory-add-broken-yaml": (
        "memory add --config {d}/broken.yaml --format locomo --input " + str(LOCOMO),
        ["broken.yaml", "line 2"],
    ),
    "memory-add-limit-not-int": ("memory add --format locomo --input x --limit all", ["--limit"]),
    "memory-load-missing-labels": (
        "memory load --store {d}/m.sqlite --labels {d}/nope.jsonl",
        ["nope.jsonl"],
    ),
    "memory-load-missing-key": (
        "memory load --store {d}/m.sqlite --labels {d}/labels-missing-key.jsonl",
        ["labels-missing-key.jsonl", "line 1"],
    ),
    "memory-load-memories-null": (
        "memory load --store {d}/m.sqlite --labels {d}/labels-null.jsonl",
        ["labels-null.jsonl", "line 1", "memories is null"],
    ),
    "memory-load-top-level-array": (
        "memory load --store {d}/m.sqlite --labels {d}/labels-array.jsonl",
        ["labels-array.jsonl", "line 1"],
    ),
    "memory-load-not-json": (
        "memory load --store {d}/m.sqlite --labels {d}/labels-not-json.jsonl",
        ["labels-not-json.jsonl", "line 1"],
    ),
    "memory-load-unknown-key": (
        "memory load --config {d}/memory-unknown.yaml --store {d}/m.sqlite --labels {d}/labels-ok.jsonl",
        ["memory-unknown.yaml", "unknown key 'retrieval.dept'"],
    ),
    "memory-search-unknown-set-key": (
        "memory search --store {d}/m.sqlite --user ann --set retrieval.dept=3 hello",
        ["unknown key 'retrieval.dept'"],
    ),
    "memory-search-broken-yaml": (
        "memory search --config {d}/broken.yaml --store {d}/m.sqlite --user ann hello",
        ["broken.yaml", "line 2"],
    ),
    "memory-search-empty-config": (
        "memory search --config {d}/list.yaml --store {d}/m.sqlite --user ann hello",
        ["list.yaml", "mapping"],
    ),
    "memory-search-k-not-int": ("memory search --store s --user ann --k many hello", ["--k"]),
    "memory-search-no-query": ("memory search --store s --user ann", ["query"]),
    # dimmem serve
    "serve-api-missing-config": ("serve api --config {d}/nope.yaml", ["nope.yaml"]),
    "serve-api-broken-yaml": ("serve api --config {d}/broken.yaml", ["broken.yaml", "line 2"]),
    "serve-api-empty-yaml": ("serve api --config {d}/empty.yaml", ["empty.yaml", "tenants"]),
    "serve-api-list-yaml": ("serve api --config {d}/list.yaml", ["list.yaml", "mapping"]),
    "serve-api-unknown-key": ("serve api --config {d}/serve-unknown.yaml", ["unknown key 'colour'"]),
    "serve-api-port-not-int": ("serve api --port http", ["--port"]),
    "serve-vllm-no-model": ("serve vllm", ["--model", "--adapter"]),
    "serve-vllm-missing-model": ("serve vllm --model {d}/nope --print", ["nope"]),
    "serve-vllm-not-an-export": ("serve vllm --adapter {d}/a-folder --print", ["a-folder"]),
    "serve-vllm-max-model-len-not-int": ("serve vllm --model m --max-model-len long", ["--max-model-len"]),
}

# defects of the memory runtime and the HTTP service this suite found: xfail until they are fixed
PENDING: dict[str, str] = {}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_input_is_one_line_and_exit_2(case, d, capsys, monkeypatch):
    if case in PENDING:
        pytest.xfail(PENDING[case])
    monkeypatch.chdir(d)  # relative outputs (o, x) land in the test's folder
    argv_text, needles = CASES[case]
    argv = [part.replace("{d}", str(d)) for part in argv_text.split()]
    code, err = run_main(argv, capsys)
    assert_one_line(code, err, *(n.replace("{d}", str(d)) for n in needles))


# ---- as users run it: `python -m dimmem` in its own process -------------------------------------------


def dimmem(*argv: str, cwd: Path, env: dict | None = None, timeout: float = 240) -> tuple[int, str]:
    """`python -m dimmem ARGV` as its own process, in `env` (the whole environment) or this one:
    (exit status, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dimmem", *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )
    return proc.returncode, proc.stderr


# inputs that once ended in a traceback (exit 1)
TRACEBACKS = [
    "windows-broken-yaml",
    "windows-empty-yaml",
    "datagen-broken-yaml",
    "datagen-empty-yaml",
    "train-broken-yaml",
    "train-empty-yaml",
    "train-missing-config",
    "serve-api-broken-yaml",
    "serve-api-empty-yaml",
    "memory-load-missing-key",
    "memory-load-memories-null",
    "memory-load-top-level-array",
]


@pytest.mark.integration
@pytest.mark.parametrize("case", TRACEBACKS)
def test_no_traceback_as_a_process(case, d):
    argv_text, needles = CASES[case]
    code, err = dimmem(*(part.replace("{d}", str(d)) for part in argv_text.split()), cwd=d)
    assert_one_line(code, err, *needles)


# ---- every port, path, quantization name and GGUF file option, given one that cannot work ------------


def write_gguf(path: Path, settings: str | int | None, name: str = "tiny") -> Path:
    """A small GGUF file: its name, `settings` under dimmem.export (text, or a number), one tensor."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    if isinstance(settings, str):
        writer.add_string(GGUF_SETTINGS_KEY, settings)
    elif settings is not None:
        writer.add_uint32(GGUF_SETTINGS_KEY, settings)
    writer.add_tensor("weight", np.arange(4096, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """GGUF files whole and broken, an export folder of one GGUF file, a training run (alone, and inside
    a folder), a folder that holds a file, an empty folder and a text file."""
    folder = tmp_path_factory.mktemp("arguments")
    whole = write_gguf(folder / "model.gguf", json.dumps({"max_model_len": 64})).read_bytes()
    (folder / "cut.gguf").write_bytes(whole[: len(whole) // 2])  # its tensor cut: an interrupted download
    write(folder, "notes.gguf", "not a model")
    write_gguf(folder / "settings-not-json.gguf", "{max_model_len: 64")
    write_gguf(folder / "settings-a-number.gguf", 64)
    # general.name said to be a gigabyte long: the field runs past the end of the file
    past = bytearray(write_gguf(folder / "field-past-end.gguf", "{}", name="tinyname").read_bytes())
    at = past.index(b"tinyname")
    past[at - 8 : at] = struct.pack("<Q", 1 << 30)
    (folder / "field-past-end.gguf").write_bytes(past)
    (folder / "export").mkdir()
    (folder / "export" / "model-q8_0.gguf").write_bytes(whole)
    meta = {"merged": True, "max_model_len": 64, "gguf": {"q8_0": "model-q8_0.gguf"}}
    write(folder, "export/dimmem_export.json", json.dumps(meta))
    training_run(folder / "run")
    (folder / "holder").mkdir()
    training_run(folder / "holder" / "run")
    write(folder, "used/old.txt", "a file of an earlier export")
    (folder / "a-folder").mkdir()
    return folder


LLAMACPP = "serve llamacpp --port {port} --model"  # a free port: the model is what is wrong

# (argv with {d} for `inputs` and {port} for a free port, what the one line must name)
ARGUMENTS = {
    # ports
    "serve-llamacpp-port-above-65535": (
        "serve llamacpp --model {d}/model.gguf --port 70000",
        ["argument --port", "'70000'"],
    ),
    "serve-llamacpp-port-negative": ("serve llamacpp --model {d}/model.gguf --port -1", ["--port", "'-1'"]),
    "serve-llamacpp-port-0": ("serve llamacpp --model {d}/model.gguf --port 0", ["--port", "'0'"]),
    "serve-llamacpp-port-not-a-number": ("serve llamacpp --model {d}/model.gguf --port http", ["--port"]),
    "serve-vllm-port-above-65535": (
        "serve vllm --model {d}/export --port 70000 --print",
        ["--port", "70000"],
    ),
    "serve-vllm-port-0": ("serve vllm --model {d}/export --port 0 --print", ["--port", "'0'"]),
    "serve-api-port-0": ("serve api --port 0", ["--port", "'0'"]),
    "serve-api-port-above-65535": ("serve api --port 70000", ["port", "70000"]),
    "serve-mcp-port-0": ("serve mcp --transport http --port 0", ["--port", "'0'"]),
    "serve-mcp-port-negative": ("serve mcp --transport http --port -1", ["port", "-1"]),
    "inspect-port-above-65535": ("inspect {d}/a-folder --port 70000", ["port", "70000"]),
    # llama.cpp's model, adapter, quantization and counts
    "serve-llamacpp-missing-model": (f"{LLAMACPP} {{d}}/nope.gguf", ["nope.gguf", "no such GGUF file"]),
    "serve-llamacpp-model-a-folder": (f"{LLAMACPP} {{d}}/a-folder", ["a-folder", "not an export folder"]),
    "serve-llamacpp-model-not-gguf": (f"{LLAMACPP} {{d}}/notes.gguf", ["notes.gguf", "not a readable GGUF"]),
    "serve-llamacpp-model-truncated": (f"{LLAMACPP} {{d}}/cut.gguf", ["cut.gguf", "not a readable GGUF"]),
    "serve-llamacpp-settings-not-json": (
        f"{LLAMACPP} {{d}}/settings-not-json.gguf",
        ["settings-not-json.gguf", "metadata field 'dimmem.export'"],
    ),
    "serve-llamacpp-settings-a-number": (
        f"{LLAMACPP} {{d}}/settings-a-number.gguf",
        ["settings-a-number.gguf", "metadata field 'dimmem.export'"],
    ),
    "serve-llamacpp-field-past-the-end": (
        f"{LLAMACPP} {{d}}/field-past-end.gguf",
        ["field-past-end.gguf", "metadata field 'general.name' runs past the end of the file"],
    ),
    "serve-llamacpp-unknown-quant": (f"{LLAMACPP} {{d}}/export --quant q9_9", ["export", "no q9_9 file"]),
    "serve-llamacpp-quant-of-a-file": (
        f"{LLAMACPP} {{d}}/model.gguf --quant q8_0",
        ["model.gguf", "--quant"],
    ),
    "serve-llamacpp-missing-lora": (f"{LLAMACPP} {{d}}/model.gguf --lora {{d}}/nope.gguf", ["nope.gguf"]),
    "serve-llamacpp-lora-a-folder": (f"{LLAMACPP} {{d}}/model.gguf --lora {{d}}/a-folder", ["a-folder"]),
    "serve-llamacpp-lora-not-gguf": (f"{LLAMACPP} {{d}}/model.gguf --lora {{d}}/notes.gguf", ["notes.gguf"]),
    "serve-llamacpp-lora-not-an-adapter": (
        f"{LLAMACPP} {{d}}/model.gguf --lora {{d}}/model.gguf",
        ["model.gguf", "not a LoRA adapter GGUF"],
    ),
    "serve-llamacpp-ctx-0": (f"{LLAMACPP} {{d}}/model.gguf --ctx 0", ["argument --ctx", "'0'"]),
    "serve-llamacpp-parallel-0": (f"{LLAMACPP} {{d}}/model.gguf --parallel 0", ["argument --parallel"]),
    "serve-llamacpp-threads-negative": (f"{LLAMACPP} {{d}}/model.gguf --threads -2", ["argument --threads"]),
    # files and folders
    "serve-api-openapi-a-folder": ("serve api --openapi {d}/a-folder", ["a-folder"]),
    "export-out-a-file": (
        "export --run {d}/run --out {d}/notes.gguf",
        ["--out", "notes.gguf", "not a folder"],
    ),
    "export-out-holds-files": ("export --run {d}/run --out {d}/used", ["--out", "used", "--overwrite"]),
    "export-overwrite-would-delete-the-run": (
        "export --run {d}/holder/run --out {d}/holder --overwrite",
        ["--out", "holder/run", "which the export reads"],
    ),
    "export-unknown-gguf-type": ("export --run {d}/run --out {d}/x --merge --gguf q9", ["--gguf", "q9"]),
    "export-push-only-a-file": (
        "export --push-only {d}/notes.gguf --push-to-hub me/x",
        ["notes.gguf", "not an export folder"],
    ),
    "memory-migrate-missing-source": (
        "memory migrate --from {d}/nope.sqlite --to {d}/t.sqlite",
        ["--from", "nope.sqlite", "no such SQLite file"],
    ),
    "memory-migrate-source-a-folder": (
        "memory migrate --from {d}/a-folder --to {d}/t.sqlite",
        ["--from", "a-folder", "no such SQLite file"],
    ),
    "memory-postgres-data-a-file": ("memory postgres --data {d}/notes.gguf", ["--data", "notes.gguf"]),
    "memory-add-input-a-folder": ("memory add --format locomo --input {d}/a-folder", ["a-folder"]),
    "memory-load-labels-a-folder": ("memory load --store {d}/m.sqlite --labels {d}/a-folder", ["a-folder"]),
    "memory-search-store-a-folder": ("memory search --store {d}/a-folder --user ann hello", ["a-folder"]),
    "memory-search-store-not-sqlite": (
        "memory search --store {d}/notes.gguf --user ann hello",
        ["notes.gguf"],
    ),
    "memory-migrate-store-a-folder": ("memory migrate --store {d}/a-folder", ["a-folder"]),
    "serve-mcp-store-a-folder": ("serve mcp --store {d}/a-folder", ["a-folder"]),
}


@pytest.mark.parametrize("case", sorted(ARGUMENTS))
def test_a_bad_port_path_quantization_or_gguf_file_is_one_line_and_exit_2(case, inputs, capsys, monkeypatch):
    monkeypatch.chdir(inputs)
    argv_text, needles = ARGUMENTS[case]
    port = str(free_port())
    argv = [part.replace("{d}", str(inputs)).replace("{port}", port) for part in argv_text.split()]
    code, err = run_main(argv, capsys)
    assert_one_line(code, err, *(n.replace("{d}", str(inputs)) for n in needles))


@pytest.mark.integration
@pytest.mark.parametrize(
    "case",
    ["serve-llamacpp-port-above-65535", "serve-llamacpp-settings-a-number", "memory-postgres-data-a-file"],
)
def test_a_bad_argument_is_no_traceback_as_a_process(case, inputs):
    """The inputs that ended in a traceback, as users run them."""
    argv_text, needles = ARGUMENTS[case]
    argv = argv_text.replace("{d}", str(inputs)).replace("{port}", str(free_port())).split()
    assert_one_line(*dimmem(*argv, cwd=inputs), *needles)


# ---- a training recipe that needs a GPU, on a machine without one -----------------------------------


def test_gpu_recipe_on_a_cpu_machine_names_the_cpu_profile(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    recipe = CONFIG_DIR / "train" / "qwen3-4b-lora.yaml"
    code, err = run_main(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")], capsys)
    assert_one_line(code, err, "qwen3-4b-lora.yaml", "needs a GPU", "configs/train/tiny.yaml")
    # with bf16 off, flash attention is the next thing a CPU cannot run: the same line, before any work
    code, err = run_main(["train", "--config", str(recipe), "--bf16", "false"], capsys)
    assert_one_line(
        code, err, "attn_implementation: flash_attention_2 needs a GPU", "configs/train/tiny.yaml"
    )
    # FlexAttention, which would keep packed rows apart, has no backward pass on a CPU
    tiny = CONFIG_DIR / "train" / "tiny.yaml"
    code, err = run_main(["train", "--config", str(tiny), "--attn_implementation", "flex_attention"], capsys)
    assert_one_line(code, err, "attn_implementation: flex_attention needs a GPU", "configs/train/tiny.yaml")


# ---- an extractor endpoint that does not answer ---------------------------------------------------------


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    """A small datagen output (toy world, oracle teacher) to evaluate against."""
    from data_gen.config import DatagenConfig
    from data_gen.run import run

    out = tmp_path_factory.mktemp("refs") / "datagen"
    cfg = {
        "source": {"format": "toy", "conversations": 6, "sessions": 2, "stories_per_session": 2},
        "out": str(out),
        "windows": {"window": 8, "overlap": 2, "max_tokens": None},
        "teacher": {"kind": "oracle"},
        "tasks": {"parse_query": False, "consolidate": False},
    }
    run(DatagenConfig.model_validate(cfg), show_progress=False)
    return out


def test_eval_extraction_at_an_unreachable_endpoint(references, tmp_path, capsys):
    endpoint = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    argv = ["eval", "extraction", "--references", f"{references}:train", "--base-url", endpoint]
    argv += ["--model", "m", "--out", str(tmp_path / "eval"), "--set", "model.max_retries=0"]
    code, err = run_main(argv, capsys)
    assert_one_line(code, err, endpoint, "connection error")


# ---- Hub push without a network or a token ----------------------------------------------------------


@pytest.fixture
def hub_env(tmp_path) -> dict:
    """No token anywhere (HF_HOME empty), online mode, and the Hub at a closed loopback port."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE")
    }
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    return env


@pytest.fixture
def rejecting_hub():
    """A Hub that refuses every token (401), as huggingface.co does a revoked one."""

    class Handler(BaseHTTPRequestHandler):
        def _refuse(self):
            body = json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_HEAD = _refuse

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def training_run(folder: Path) -> Path:
    """What `dimmem export` reads from a run, without training: an adapter (opaque bytes: an adapter
    export only copies them), the tokenizer and dimmem_train.json."""
    from dimmem.paths import shared_data

    folder.mkdir()
    for file in shared_data("qwen3-tokenizer").iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"not really weights")
    run_config = {"base_model": "Qwen/Qwen3-4B", "dimmem": {"dataset_path": "data"}, "model": {}, "sft": {}}
    (folder / "dimmem_train.json").write_text(json.dumps(run_config))
    return folder


def push_failed(code: int, err: str, folder: Path, retry: str, *needles: str) -> None:
    line = assert_one_line(code, err, "push failed", *needles)
    assert f"{folder.resolve()} is complete and kept" in line and retry in line, line


@pytest.mark.integration
def test_export_push_without_network_or_token_keeps_the_export(tmp_path, hub_env, rejecting_hub):
    run, out = training_run(tmp_path / "run"), tmp_path / "export"
    retry = f"dimmem export --push-only {out.resolve()} --push-to-hub me/x"
    # no token: said before any network call
    code, err = dimmem(
        "export", "--run", str(run), "--out", str(out), "--push-to-hub", "me/x", cwd=tmp_path, env=hub_env
    )
    push_failed(code, err, out, retry, "no Hugging Face token", "HF_TOKEN")
    exported = sorted(p.name for p in out.iterdir())
    assert {"adapter_model.safetensors", "dimmem_export.json", "README.md", "tokenizer.json"} <= set(exported)
    # a token, but no network: the push-later command is accepted and fails the same clean way
    env = {**hub_env, "HF_TOKEN": "hf_test"}
    code, err = dimmem(
        "export", "--push-only", str(out), "--push-to-hub", "me/x", "--revision", "v1", cwd=tmp_path, env=env
    )
    push_failed(code, err, out, retry + " --revision v1", f"cannot reach {hub_env['HF_ENDPOINT']}")
    # a token the Hub rejects
    env["HF_ENDPOINT"] = rejecting_hub
    code, err = dimmem("export", "--push-only", str(out), "--push-to-hub", "me/x", cwd=tmp_path, env=env)
    push_failed(code, err, out, retry, f"{rejecting_hub} rejected the token (401")
    assert sorted(p.name for p in out.iterdir()) == exported  # the export is untouched throughout


@pytest.mark.integration
def test_datagen_push_without_network_or_token_keeps_the_outputs(tmp_path, hub_env, rejecting_hub):
    out = tmp_path / "datagen"
    config = CONFIG_DIR / "datagen" / "toy.yaml"
    argv = [
        "datagen",
        "--config",
        str(config),
        "--out",
        str(out),
        "--set",
        "source.conversations=4",
        "--quiet",
    ]
    retry = f"dimmem datagen --push-only {out.resolve()} --push-to-hub me/toy"
    code, err = dimmem(*argv, "--push-to-hub", "me/toy", cwd=tmp_path, env={**hub_env, "HF_TOKEN": "hf_test"})
    push_failed(code, err, out, retry, f"cannot reach {hub_env['HF_ENDPOINT']}")
    written = sorted(p.name for p in out.iterdir())
    assert {"dataset", "labels.jsonl", "report.json", "README.md"} <= set(written)
    code, err = dimmem(
        "datagen", "--push-only", str(out), "--push-to-hub", "me/toy", cwd=tmp_path, env=hub_env
    )
    push_failed(code, err, out, retry, "no Hugging Face token")
    env = {**hub_env, "HF_TOKEN": "hf_test", "HF_ENDPOINT": rejecting_hub}
    code, err = dimmem(
        "datagen", "--push-only", str(out), "--push-to-hub", "me/toy", "--private", cwd=tmp_path, env=env
    )
    push_failed(code, err, out, retry + " --private", "rejected the token (401")
    assert sorted(p.name for p in out.iterdir()) == written
