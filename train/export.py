"""Export a training run: the LoRA adapter, or the adapter merged into its base, as a `save_pretrained`
folder with tokenizer, chat template, serving-matched generation config and a model card; optionally
pushed to the Hugging Face Hub.

    dimmem export --run runs/train/qwen3-4b-lora --out exports/dimmem-qwen3-4b --merge \\
        [--checkpoint 400] [--push-to-hub me/dimmem-qwen3-4b --private --revision v1]

Merging runs here, in its own single process, never inside a distributed training job.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from dimmem.contract.tokens import CHAT_TEMPLATE_KWARGS
from dimmem.paths import EXPORT_CONFIG

RUN_CONFIG = "dimmem_train.json"  # written by train.sft beside the adapter

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def adapter_dir(run: Path, checkpoint: int | None) -> Path:
    folder = run / f"checkpoint-{checkpoint}" if checkpoint is not None else run
    if not (folder / "adapter_config.json").exists():
        available = sorted(p.name for p in run.glob("checkpoint-*"))
        raise FileNotFoundError(f"no LoRA adapter in {folder} (checkpoints in {run}: {available or 'none'})")
    return folder


def export(
    run: str | Path,
    out: str | Path,
    checkpoint: int | None = None,
    merge: bool = False,
    max_new_tokens: int = 4096,
) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError("export merges in a single process: run it outside torchrun/accelerate launch")
    run, out = Path(run), Path(out)
    run_config = json.loads((run / RUN_CONFIG).read_text())
    source = adapter_dir(run, checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(source)
    out.mkdir(parents=True, exist_ok=True)
    if merge:
        from peft import PeftModel

        dtype = torch.bfloat16 if run_config["sft"].get("bf16") else torch.float32
        base = AutoModelForCausalLM.from_pretrained(run_config["base_model"], dtype=dtype)
        merged = PeftModel.from_pretrained(base, source).merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
    else:
        for name in ADAPTER_FILES:
            shutil.copy2(source / name, out / name)
    tokenizer.save_pretrained(out)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Greedy decoding, as the extractor is served and evaluated; thinking is off through the chat template
    # arguments recorded in dimmem_export.json (a generation config cannot carry them).
    GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(out)
    export_config = {
        "base_model": run_config["base_model"],
        "merged": merge,
        "checkpoint": checkpoint,
        "max_model_len": run_config["sft"].get("max_length"),
        "lora_r": run_config["model"].get("lora_r"),
        "chat_template_kwargs": CHAT_TEMPLATE_KWARGS,
        "run": str(run.resolve()),
    }
    (out / EXPORT_CONFIG).write_text(json.dumps(export_config, indent=2) + "\n")
    (out / "README.md").write_text(model_card(run_config, export_config, run))
    return out


def model_card(run_config: dict, export_config: dict, run: Path) -> str:
    base = run_config["base_model"]
    base_id = base if not Path(base).exists() else Path(base).name
    merged = export_config["merged"]
    metrics_path = next(
        (p for p in (run / "eval" / "metrics.json", run / "metrics.json") if p.exists()), None
    )
    metrics = json.loads(metrics_path.read_text()) if metrics_path else {}
    dataset = run_config["dimmem"]["dataset_path"]
    lines = [
        "---",
        f"base_model: {base_id}",
        f"library_name: {'transformers' if merged else 'peft'}",
        "license: apache-2.0",
        "pipeline_tag: text-generation",
        "tags: [dimmem, memory-extraction, lora, sft, trl]",
    ]
    if "/" in dataset and not Path(dataset).exists():
        lines.append(f"datasets: [{dataset}]")
    lines.append("---")
    table = "\n".join(f"| {k} | {v} |" for k, v in {**run_config["sft"], **run_config["model"]}.items())
    metric_rows = "\n".join(f"| {k} | {v} |" for k, v in metrics.items() if isinstance(v, (int, float)))
    serve_target = "THIS_FOLDER" if merged else base_id
    lora_flags = "" if merged else "--enable-lora --lora-modules dimmem=THIS_FOLDER "
    max_model_len = export_config["max_model_len"]
    evaluation = (
        ("| metric | value |" + chr(10) + "|---|---|" + chr(10) + metric_rows)
        if metric_rows
        else "No evaluation report was found next to the run."
    )
    return (
        "\n".join(lines)
        + f"""

# DimMem memory extractor ({"merged" if merged else "LoRA adapter"} on {base_id})

A compact extractor that turns a window of dialogue into DimMem memory records: atomic, typed
(`fact` / `episodic` / `profile`) with explicit time, location, reason, purpose and keywords, and the
ids of the turns they come from. Trained with LoRA SFT (TRL) on teacher labels from `{Path(dataset).name}`.

## Intended use
Memory extraction for LLM agents, behind a memory runtime that validates every answer. Prompt it with
the DimMem extract prompt (the training data's system and user messages) and render the chat template
with `enable_thinking=False`; serve it with structured outputs on the DimMem JSON Schema. It is not a
general chat model.

## Serving
```bash
vllm serve {serve_target} {lora_flags}--max-model-len {max_model_len} \\
  --default-chat-template-kwargs '{json.dumps(CHAT_TEMPLATE_KWARGS)}'
```

## Training
| setting | value |
|---|---|
{table}
| final step | {run_config.get("final_step")} |
| processes | {run_config.get("world_size")} |

## Evaluation
{evaluation}
"""
    )


def push(folder: str | Path, repo_id: str, private: bool = False, revision: str | None = None) -> str:
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision:
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    api.upload_folder(
        repo_id=repo_id,
        folder_path=str(folder),
        revision=revision,
        repo_type="model",
        commit_message="Upload DimMem extractor export",
    )
    return str(url)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="the training run's output_dir")
    p.add_argument("--checkpoint", type=int, help="export checkpoint-N instead of the final adapter")
    p.add_argument("--out", required=True)
    p.add_argument("--merge", action="store_true", help="merge the adapter into the base weights")
    p.add_argument("--push-to-hub", metavar="REPO")
    p.add_argument("--private", action="store_true")
    p.add_argument("--revision", help="branch to push to (created when missing)")


def run(args: argparse.Namespace) -> int:
    folder = export(args.run, args.out, args.checkpoint, args.merge)
    print(f"exported {'merged model' if args.merge else 'adapter'} to {folder}")
    if args.push_to_hub:
        print(f"pushed to {push(folder, args.push_to_hub, args.private, args.revision)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__.splitlines()[0])
    add_arguments(parser)
    from dimmem.errors import run_command

    return run_command("export", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
