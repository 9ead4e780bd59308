"""The vLLM server command for exported extractors: flags from dimmem_export.json, and (where
`make serve-cpu` has built .venv-vllm) the command checked by vLLM's own argument parser."""
import json
import subprocess

import pytest

from serve.cli import VLLM_PYTHON, VLLM_READY
from serve.vllm import lora_rank, vllm_command


def export(folder, merged: bool, **fields):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dimmem_export.json").write_text(json.dumps({
        "base_model": "Qwen/Qwen3-4B", "merged": merged, "max_model_len": 8192, "lora_r": 12,
        "chat_template_kwargs": {"enable_thinking": False}, **fields}))
    return folder


def flag(command, name):
    return command[command.index(name) + 1]


def test_merged_export_is_served_under_the_extractor_name_with_training_settings(tmp_path):
    command = vllm_command(model=str(export(tmp_path / "merged", merged=True)), port=8011)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and flag(command, "--port") == "8011"
    assert json.loads(flag(command, "--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert json.loads(flag(command, "--structured-outputs-config")) == {"backend": "xgrammar"}
    assert flag(command, "--max-model-len") == "8192" and "--enable-prefix-caching" in command
    assert flag(command, "--served-model-name") == "dimmem-extractor" and "--enable-lora" not in command


def test_adapter_export_is_served_as_lora_over_its_base(tmp_path):
    adapter = export(tmp_path / "adapter", merged=False)
    command = vllm_command(adapter=str(adapter))
    assert flag(command, "--model") == "Qwen/Qwen3-4B" and flag(command, "--served-model-name") == "dimmem-extractor-base"
    assert flag(command, "--lora-modules") == f"dimmem-extractor={adapter}" and flag(command, "--max-lora-rank") == "16"
    assert flag(vllm_command(base="local/base", adapter=str(adapter)), "--model") == "local/base"
    assert lora_rank(8) == 8 and lora_rank(65) == 128


def test_mismatched_exports_are_refused_with_the_right_command(tmp_path):
    with pytest.raises(ValueError, match="--base Qwen/Qwen3-4B --adapter"):
        vllm_command(model=str(export(tmp_path / "a", merged=False)))
    with pytest.raises(ValueError, match="serve it with --model"):
        vllm_command(adapter=str(export(tmp_path / "m", merged=True)))
    with pytest.raises(FileNotFoundError, match="dimmem_export.json"):
        vllm_command(model=str(tmp_path))
    with pytest.raises(ValueError, match="either a merged export"):
        vllm_command()


@pytest.mark.integration
@pytest.mark.skipif(not VLLM_READY, reason="needs .venv-vllm (`make serve-cpu`)")
def test_vllm_accepts_the_command(tmp_path):
    for command in (vllm_command(model=str(export(tmp_path / "m", merged=True))),
                    vllm_command(adapter=str(export(tmp_path / "a", merged=False)))):
        check = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                 "from vllm.entrypoints.launchers.cli_args import make_arg_parser; "
                 "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:]); "
                 "print(a.default_chat_template_kwargs, a.enable_prefix_caching, a.max_model_len)")
        out = subprocess.run([str(VLLM_PYTHON), "-c", check, *command[3:]], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split()[:3] == ["{'enable_thinking':", "False}", "True"]
