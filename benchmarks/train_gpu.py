"""Training throughput of the real Qwen3-4B architecture through the project's own training code.

Random weights from Qwen3-4B's exact config (nothing is downloaded), a synthetic dataset of DimMem
extraction rows of ~`--seq` tokens, `train.sft.train` with `configs/train/qwen3-4b-lora.yaml` plus the
overrides in `configs/train/qwen3-4b-bench.yaml`, and those of one of its named `variants` (`--variant`:
answer-only logits, Liger kernels, activation checkpointing off, 12k tokens). Prints and writes tokens/s
(steady state, after `--warmup` steps), peak GPU memory and MFU.

    python -m benchmarks.train_gpu --tokenizer PATH --work /tmp/bench --variant liger --json bench.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from datasets import Dataset, DatasetDict
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, TrainerCallback

from dimmem.config import Section, add_set_argument, load_config
from dimmem.contract.prompts import load_prompt
from dimmem.contract.records import memory_record
from dimmem.contract.tokens import render_prompt
from dimmem.paths import CONFIG_DIR
from train.args import parse_args
from train.sft import train
from train.throughput import attention_flops, linear_params, model_flops_per_token


class BenchConfig(Section):
    architecture: dict  # Qwen3Config fields
    peak_tflops: float  # the GPU's dense bf16 peak, what MFU is quoted against
    train: dict  # training fields (TRL's names) overriding configs/train/qwen3-4b-lora.yaml
    variants: dict[str, dict] = {}  # name -> training fields on top of `train`


class StepTimer(TrainerCallback):
    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())


def synthetic_rows(tokenizer, seq: int, n: int) -> list[dict]:
    """Extraction rows whose rendered length is just under `seq` tokens: a long window, a JSON answer."""
    system = load_prompt("extract").system.strip()
    answer = json.dumps(
        {
            "memories": [
                memory_record(
                    source_turns=[f"t{i}"],
                    speaker="Ann",
                    content=f"Ann visited the museum on 2023-05-{i:02d}.",
                    type="episodic",
                    time=f"2023-05-{i:02d}",
                    location="the museum",
                    keywords=["Ann", "museum"],
                )
                for i in range(1, 9)
            ]
        },
        separators=(",", ":"),
    )
    line = "t{} Ann: I went to the museum with my sister and we talked about painting for hours.\n"
    per_line = len(tokenizer(line.format(10), add_special_tokens=False)["input_ids"])
    overhead = (
        len(
            tokenizer(
                render_prompt(
                    tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": ""}]
                )
                + answer,
                add_special_tokens=False,
            )["input_ids"]
        )
        + 1
    )
    lines = (seq - overhead - 16) // per_line
    while True:  # line numbers grow in digits, so measure the whole row and shrink until it fits
        user = "## New turns (extract memories from these)\n" + "".join(
            line.format(i) for i in range(1, lines + 1)
        )
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
            {"role": "assistant", "content": answer},
        ]
        length = (
            len(
                tokenizer(render_prompt(tokenizer, messages[:-1]) + answer, add_special_tokens=False)[
                    "input_ids"
                ]
            )
            + 1
        )
        if length <= seq:
            break
        lines -= (length - seq) // per_line + 1
    return [
        {"messages": messages, "conversation_id": f"c{i}", "window_id": f"c{i}/w0", "task": "extract"}
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-config", default=str(CONFIG_DIR / "train" / "qwen3-4b-bench.yaml"))
    parser.add_argument("--tokenizer", required=True, help="a Qwen3 tokenizer folder")
    parser.add_argument("--work", default="/tmp/dimmem-bench", help="scratch folder for weights and data")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the steady-state rate")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--variant", help="one of the bench config's variants (default: the recipe)")
    add_set_argument(parser, "train.max_steps=5")
    args = parser.parse_args()

    bench = load_config(BenchConfig, args.bench_config, args.overrides)
    if args.variant and args.variant not in bench.variants:
        parser.error(
            f"--variant {args.variant!r}: not in {args.bench_config} (one of {', '.join(bench.variants)})"
        )
    train_fields = {**bench.train, **bench.variants.get(args.variant, {})}
    work = Path(args.work)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    cfg = Qwen3Config(
        **bench.architecture,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(work / "base")
    tokenizer.save_pretrained(work / "base")
    del model
    seq, steps = int(train_fields["max_length"]), int(train_fields["max_steps"])
    batch = int(train_fields["per_device_train_batch_size"])
    rows = synthetic_rows(tokenizer, seq, steps * batch + 8)
    DatasetDict({"train": Dataset.from_list(rows), "validation": Dataset.from_list(rows[:2])}).save_to_disk(
        str(work / "data")
    )
    setup_s = time.perf_counter() - started

    argv = [
        "--config",
        str(CONFIG_DIR / "train" / "qwen3-4b-lora.yaml"),
        "--model_name_or_path",
        str(work / "base"),
        "--dataset_path",
        str(work / "data"),
        "--output_dir",
        str(work / "run"),
    ]
    for key, value in train_fields.items():
        argv += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    if device == "cpu":
        argv += ["--bf16", "false", "--dtype", "float32", "--activation_checkpointing", "false"]
    timer = StepTimer()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    dimmem_args, sft_args, model_args = parse_args(argv)
    train(dimmem_args, sft_args, model_args, callbacks=[timer])

    tokens_per_row = (
        len(
            tokenizer(
                render_prompt(tokenizer, rows[0]["messages"][:-1]) + rows[0]["messages"][-1]["content"],
                add_special_tokens=False,
            )["input_ids"]
        )
        + 1
    )
    steady = timer.ends[args.warmup :]
    tokens_per_s = (len(steady) - 1) * batch * tokens_per_row / (steady[-1] - steady[0])
    n_linear, attn = linear_params(cfg), attention_flops(cfg, tokens_per_row)
    flops_per_token = model_flops_per_token(cfg, tokens_per_row)
    result = {
        "variant": args.variant or "recipe",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "architecture": "Qwen3-4B (random init)",
        "seq_tokens": tokens_per_row,
        "batch": batch,
        "steps": len(timer.ends),
        "steady_steps": len(steady) - 1,
        "tokens_per_s": round(tokens_per_s, 1),
        "step_s": round((steady[-1] - steady[0]) / (len(steady) - 1), 3),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None,
        "model_tflops_per_token": round(flops_per_token / 1e12, 6),
        "mfu": round(tokens_per_s * flops_per_token / (bench.peak_tflops * 1e12), 4),
        # hardware utilization also counts the forward pass activation checkpointing repeats
        "hfu": round(
            tokens_per_s
            * (flops_per_token + (2 * n_linear + attn / 3) * sft_args.activation_checkpointing)
            / (bench.peak_tflops * 1e12),
            4,
        ),
        "activation_checkpointing": sft_args.activation_checkpointing,
        "setup_s": round(setup_s, 1),
        "train_args": train_fields,
        "torch": torch.__version__,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
