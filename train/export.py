"""Export a training run: the LoRA adapter, or the adapter merged into its base, as a `save_pretrained`
folder with tokenizer, chat template, serving-matched generation config and a model card; optionally
pushed to the Hugging Face Hub.

    dimmem export --run runs/train/qwen3-4b-lora --out exports/dimmem-qwen3-4b --merge \\
        [--checkpoint 400|best] [--gguf q8_0,q4_k_m] [--push-to-hub me/dimmem-qwen3-4b --private]
    dimmem export --run runs/train/qwen3-4b-lora --out exports/dimmem-lora --gguf f16 --adapter-dtype float16
    dimmem export --push-only exports/dimmem-qwen3-4b --push-to-hub me/dimmem-qwen3-4b   # push it later

Merging runs here, in its own single process, never inside a distributed training job. `--gguf` also
writes the merged model as GGUF files with an Ollama Modelfile, for llama.cpp on a laptop
(train/gguf_export.py); without `--merge`, the adapter as a GGUF LoRA that llama.cpp applies over its base.
An adapter export keeps the run's record, so it is itself a run `--run` takes: `--merge` rebuilds the
full model from it, and a base built from a packaged GGUF file that is not on this machine is built again
from its packages. `--checkpoint best` is the checkpoint of lowest validation loss. Every file of an
export is listed with its sha256 in `SHA256SUMS`, so `--out` is a new or empty folder (`--overwrite` empties
one that is not).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from dimmem.contract.tokens import CHAT_TEMPLATE_KWARGS, end_of_turn
from dimmem.paths import (
    CHECKSUMS,
    EXPORT_CONFIG,
    LORA_GGUF,
    REPO_ROOT,
    RUN_CONFIG,
    cache_dir,
    dataset_folder,
    read_export_config,
    read_run_config,
)
from train.checkpoints import best_step, checkpoint_steps
from train.gguf_base import provenance as gguf_provenance


def best_checkpoint(run: Path) -> int:
    """The saved checkpoint of lowest validation loss, from the trainer's log of the newest one."""
    saved = checkpoint_steps(run)
    if not saved:
        raise FileNotFoundError(f"--checkpoint best: {run} holds no checkpoint-N folder")
    best = best_step(run)
    if best is None:
        state = run / f"checkpoint-{saved[-1]}" / "trainer_state.json"
        raise ValueError(f"--checkpoint best: no saved checkpoint of {run} has a validation loss ({state})")
    return best


def adapter_dir(run: Path, checkpoint: int | None) -> Path:
    folder = run / f"checkpoint-{checkpoint}" if checkpoint is not None else run
    if not (folder / "adapter_config.json").exists():
        available = sorted(p.name for p in run.glob("checkpoint-*"))
        raise FileNotFoundError(f"no LoRA adapter in {folder} (checkpoints in {run}: {available or 'none'})")
    return folder


def run_record(run: Path) -> dict:
    """The run's `dimmem_train.json` with what an export reads from it, or one clear error naming it."""
    config = read_run_config(run)
    missing = [k for k in ("base_model", "sft", "model", "dimmem") if k not in config]
    if missing:
        raise ValueError(f"{run / RUN_CONFIG}: not the {RUN_CONFIG} dimmem train writes (no {missing[0]!r})")
    return config


def base_folder(run_config: dict) -> str:
    """The run's base model: its folder, or, where that is not on this machine and the base was built
    from a packaged GGUF file, that base built again from its packages (once, in the dimmem cache)."""
    base = run_config["base_model"]
    spec = run_config["dimmem"].get("gguf_base")
    if Path(base).is_dir() or not spec:
        return base
    from train.gguf_base import build_gguf_base, is_built

    folder = cache_dir() / "bases" / f"{spec['model_id'].replace('/', '--')}-{spec['sha256'][:12]}"
    if not is_built(folder, **spec):
        print(f"building the base {spec['model_id']} from {spec.get('parts') or spec.get('package')} (once)")
        build_gguf_base(folder, **spec)
    return str(folder)


def export(
    run: str | Path,
    out: str | Path,
    checkpoint: int | str | None = None,
    merge: bool = False,
    max_new_tokens: int = 4096,
    gguf: list[str] | None = None,
    adapter_dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the export into `out`, a new or empty folder; `overwrite`: one that holds files is emptied
    first (SHA256SUMS lists every file of the folder, and no file of an earlier export may stay)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("export merges in a single process: run it outside torchrun/accelerate launch")
    if gguf and not merge and gguf != ["f16"]:
        raise ValueError(
            "--gguf without --merge writes the adapter as a GGUF LoRA: --gguf f16 (or add --merge)"
        )
    if adapter_dtype and merge:
        raise ValueError("--adapter-dtype is for an adapter export (without --merge)")
    run, out = Path(run), Path(out)
    run_config = run_record(run)
    check_out(out, overwrite, [run, Path(run_config["base_model"])])
    if checkpoint == "best":
        checkpoint = best_checkpoint(run)
    source = adapter_dir(run, checkpoint)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    base_model = base_folder(run_config)
    has_tokenizer = any((source / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
    tokenizer = AutoTokenizer.from_pretrained(source if has_tokenizer else base_model)
    if overwrite and out.is_dir():
        empty_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    if merge:
        from peft import PeftModel

        dtype = torch.bfloat16 if run_config["sft"].get("bf16") else torch.float32
        base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype)
        merged = PeftModel.from_pretrained(base, source).merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
    else:
        write_adapter(source, out, adapter_dtype, gguf_provenance(base_model))
        # the run's record beside the adapter: this export is a run `dimmem export --run` takes again
        record = {**run_config, "final_step": checkpoint or run_config.get("final_step")}
        (out / RUN_CONFIG).write_text(json.dumps(record, indent=2) + "\n")
    tokenizer.save_pretrained(out)
    eos = tokenizer.convert_tokens_to_ids(end_of_turn(tokenizer))
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
    if base := gguf_provenance(base_model):
        export_config["base_provenance"] = base
    # the safetensors export is complete before any conversion: a GGUF that fails (an architecture the
    # converter lacks, a full disk) costs only the GGUF files
    write_export_files(out, export_config, run_config, run)
    if gguf and merge:
        export_config["gguf"] = gguf_files(out, gguf, export_config, tokenizer)
    elif gguf:
        from train.gguf_export import write_lora_gguf

        export_config["lora_gguf"] = write_lora_gguf(out, Path(base_model), out / LORA_GGUF).name
    write_export_files(out, export_config, run_config, run)
    write_checksums(out)
    return out


def check_out(out: Path, overwrite: bool, sources: list[Path]) -> None:
    """Refuse an --out that is a file, that holds files without `overwrite`, or that holds what the
    export reads (the run, the base model), which emptying it would delete."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: a file, not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ValueError(
            f"--out {out}: the folder holds files already; pass --overwrite to empty it first, or pick "
            "a new folder"
        )
    for source in sources:
        if source.exists() and source.resolve().is_relative_to(out.resolve()):
            raise ValueError(f"--out {out} --overwrite would delete {source}, which the export reads")


def empty_folder(folder: Path) -> None:
    """Remove everything inside `folder` (the folder stays)."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def write_adapter(source: Path, out: Path, dtype: str | None, base: dict | None) -> None:
    """The adapter's config and weights, the weights cast to `dtype` when one is given (an adapter
    shipped at half the size). A base built from a packaged GGUF is named by its Hub id, which PEFT
    resolves anywhere, not by the folder it was built into here."""
    config = json.loads((source / "adapter_config.json").read_text())
    if base:
        config["base_model_name_or_path"] = base["model_id"]
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = source / "adapter_model.safetensors"
    if dtype is None:
        shutil.copy2(weights, out / weights.name)
        return
    import torch
    from safetensors.torch import load_file, save_file

    cast = {k: v.to(getattr(torch, dtype)) for k, v in load_file(weights).items()}
    save_file(cast, out / weights.name, metadata={"format": "pt"})


def write_checksums(out: Path) -> Path:
    """SHA256SUMS: every file of the export with its sha256, as `sha256sum -c` reads it."""
    from dimmem.gguf_file import file_sha256

    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    lines = [f"{file_sha256(p)}  {p.relative_to(out).as_posix()}" for p in files]
    path = out / CHECKSUMS
    path.write_text("\n".join(lines) + "\n")
    return path


def write_export_files(out: Path, export_config: dict, run_config: dict, run: Path) -> None:
    """dimmem_export.json and the model card, from what the export holds so far."""
    (out / EXPORT_CONFIG).write_text(json.dumps(export_config, indent=2) + "\n")
    (out / "README.md").write_text(model_card(run_config, export_config, run))


def gguf_files(out: Path, kinds: list[str], export_config: dict, tokenizer) -> dict:
    """The GGUF files of a merged export (each with its serving settings inside) and a Modelfile for the
    first of them; {kind: file name}."""
    from train.gguf_export import modelfile, write_gguf

    settings = {k: export_config[k] for k in ("max_model_len", "chat_template_kwargs", "checkpoint")}
    parent = retrained_from(export_config["base_model"])
    files = write_gguf(out, kinds, settings, parent)
    (out / "Modelfile").write_text(modelfile(files[kinds[0]], tokenizer, export_config["max_model_len"]))
    return files


def retrained_from(base_model: str) -> str | None:
    """The tokenizer a tiny base's vocabulary was retrained from (its spec names it), else None."""
    from train.tiny import SPEC_FILE

    spec = Path(base_model) / SPEC_FILE
    parent = json.loads(spec.read_text()).get("tokenizer") if spec.is_file() else None
    if parent and not Path(parent).exists() and (REPO_ROOT / parent).exists():
        return str(REPO_ROOT / parent)  # the configs' paths are relative to the repository
    return parent


def model_card(run_config: dict, export_config: dict, run: Path) -> str:
    base = run_config["base_model"]
    origin = export_config.get("base_provenance")
    base_id = origin["model_id"] if origin else base if not Path(base).exists() else Path(base).name
    merged = export_config["merged"]
    metrics_path = next(
        (p for p in (run / "eval" / "metrics.json", run / "metrics.json") if p.exists()), None
    )
    metrics = json.loads(metrics_path.read_text()) if metrics_path else {}
    dataset = run_config["dimmem"]["dataset_path"]
    # an export exported again (a shipped adapter merged) keeps the license its card chose
    source_card = (run / "README.md").read_text() if (run / "README.md").is_file() else ""
    kept_license = re.search(r"^license: (.+)$", source_card, re.M)
    lines = [
        "---",
        f"base_model: {base_id}",
        f"library_name: {'transformers' if merged else 'peft'}",
        f"license: {kept_license[1] if kept_license else origin['license'] if origin else 'apache-2.0'}",
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

{gguf_section(export_config)}{base_section(origin)}{data_section(run_config, origin, source_card)}## Training
| setting | value |
|---|---|
{table}
| step exported | {export_config.get("checkpoint") or run_config.get("final_step")} |
| processes | {run_config.get("world_size")} |

## Evaluation
{evaluation}
"""
    )


def gguf_section(export_config: dict) -> str:
    """How to run the export's GGUF files with llama.cpp and Ollama (a merged export), or its adapter as a
    GGUF LoRA over its base (an adapter export)."""
    if lora := export_config.get("lora_gguf"):
        return f"""## llama.cpp, and the memory runtime
`{lora}` is this adapter as a GGUF LoRA (llama.cpp's tensor names, f16). llama.cpp applies it over the base's
own GGUF file, the weights it was trained on:
```bash
dimmem serve llamacpp --model BASE.gguf --lora {lora} --port 8080
```
The memory runtime runs it with `extractor: student` and `student.folder: THIS_FOLDER` (the base assembled
from its packages on first use).

"""
    files = export_config.get("gguf")
    if not files:
        return ""
    first = next(iter(files.values()))
    listed = "\n".join(f"| `{name}` | {kind} |" for kind, name in files.items())
    return f"""## llama.cpp and Ollama
| file | weights |
|---|---|
{listed}

Each file carries its serving settings (`dimmem.export`: context length, chat template arguments). Serve one
on a CPU behind an OpenAI-compatible endpoint, each request's JSON Schema (`response_format`) enforced as a
grammar:
```bash
dimmem serve llamacpp --model {first} --port 8080      # or: llama-server -m {first} --jinja --temp 0
ollama create dimmem-extractor -f Modelfile              # the Modelfile beside it: template, stop token
```

"""


def base_section(origin: dict | None) -> str:
    """Where a base built from a packaged GGUF file came from, and under which license."""
    if not origin:
        return ""
    parts = origin.get("parts")
    shipped = (
        f"the PyPI packages `{parts[0]}` ... `{parts[-1]}` (its chunks, concatenated)"
        if parts
        else f"the PyPI package `{origin['distribution']}`"
    )
    return f"""## Base model
`{origin["model_id"]}` ({origin["license"]}), read from `{origin["file"]}`
(sha256 `{origin["sha256"]}`) in {shipped} {origin["version"]} and
dequantized to {origin["dtype"]} by transformers (what the file's quantization lost is not recovered).

"""


def data_section(run_config: dict, origin: dict | None, source_card: str) -> str:
    """What the model learned from and under which licenses: an export exported again (a shipped adapter
    merged) keeps its own card's section, whatever dataset this machine has at the path it names; a run
    takes it from the dataset's card (written by `dimmem datagen`)."""
    kept = re.search(r"^## Data and licenses\n.*?(?=^## |\Z)", source_card, re.M | re.S)
    if kept:
        return kept[0].rstrip() + "\n\n"
    try:
        card = dataset_folder(run_config["dimmem"]["dataset_path"]).parent / "README.md"
    except FileNotFoundError:  # trained elsewhere, and no card of its own says it
        return ""
    if not card.is_file():
        return ""
    found = re.search(r"^- \*\*Source\*\*: (.+); license: (.+)$", card.read_text(), re.M)
    teacher = re.search(r"^- \*\*Teacher\*\*: (.+)$", card.read_text(), re.M)
    if not found:
        return ""
    base_license = origin["license"] if origin else "the base model's"
    return f"""## Data and licenses
Trained on labels of {found[1]} by the {teacher[1] if teacher else "dataset's"} teacher
(`{run_config["dimmem"]["dataset_path"]}`). The training data's license: {found[2]}. The base model's
license: {base_license}. The adapter learned from the data, so use it as the stricter of the two allows.

"""


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
    p.add_argument("--run", help="the training run's output_dir")
    p.add_argument(
        "--checkpoint",
        type=checkpoint_arg,
        help="export checkpoint-N instead of the final adapter; best: the one of lowest validation loss",
    )
    p.add_argument("--out", help="the export folder to write (new or empty, unless --overwrite)")
    p.add_argument(
        "--overwrite", action="store_true", help="empty an --out folder that holds files first (else refused)"
    )
    p.add_argument("--merge", action="store_true", help="merge the adapter into the base weights")
    p.add_argument(
        "--gguf",
        metavar="TYPES",
        help="also write GGUF files for llama.cpp and Ollama (with --merge): q8_0, f16, q4_k_m, "
        "comma-separated; without --merge, f16: the adapter as a GGUF LoRA (adapter.gguf)",
    )
    p.add_argument(
        "--adapter-dtype",
        choices=["float16", "bfloat16", "float32"],
        help="an adapter export's weights in this type (float16: half the size of a float32 run's)",
    )
    p.add_argument(
        "--push-to-hub",
        metavar="REPO",
        help="then push the folder to this Hub model repo; if the push fails (no network, no or a rejected "
        "token) the export stays complete, the command exits 2 and prints the --push-only command to push it",
    )
    p.add_argument(
        "--push-only",
        metavar="FOLDER",
        help="push a finished export folder to --push-to-hub REPO, without exporting again",
    )
    p.add_argument("--private", action="store_true")
    p.add_argument("--revision", help="branch to push to (created when missing)")


def run(args: argparse.Namespace) -> int:
    from dimmem.config import ConfigError

    if args.push_only:
        if not args.push_to_hub or args.run or args.out or args.overwrite:
            raise ConfigError(
                "--push-only FOLDER takes --push-to-hub REPO (and no --run, --out or --overwrite)"
            )
        folder = Path(args.push_only)
        read_export_config(folder)  # FileNotFoundError: not an export folder
        print(f"pushed to {push_checked(folder, args)}")
        return 0
    if not args.run or not args.out:
        raise ConfigError("--run and --out are required (or --push-only FOLDER --push-to-hub REPO)")
    if args.push_to_hub:
        check_repo_id(args.push_to_hub)  # a bad name fails before the export, not after it
    kinds = None
    if args.gguf:
        from train.gguf_export import parse_types

        kinds = parse_types(args.gguf)  # a typo fails before the merge, not after it
    folder = export(
        args.run,
        args.out,
        args.checkpoint,
        args.merge,
        gguf=kinds,
        adapter_dtype=args.adapter_dtype,
        overwrite=args.overwrite,
    )
    print(f"exported {'merged model' if args.merge else 'adapter'} to {folder}")
    if args.push_to_hub:
        print(f"pushed to {push_checked(folder, args)}")
    return 0


def checkpoint_arg(text: str) -> int | str:
    if text == "best":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a step number, or best") from None


def check_repo_id(repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ValueError(f"--push-to-hub {repo_id}: {exc}") from None


def push_checked(folder: Path, args: argparse.Namespace) -> str:
    """`push`, with a failure said in one line that gives the command to push this folder later."""
    from dimmem.errors import hub_push

    retry = f"dimmem export --push-only {shlex.quote(str(folder.resolve()))} --push-to-hub {args.push_to_hub}"
    retry += " --private" if args.private else ""
    retry += f" --revision {shlex.quote(args.revision)}" if args.revision else ""
    return hub_push(
        lambda: push(folder, args.push_to_hub, args.private, args.revision), folder.resolve(), retry
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train.export", description=__doc__.splitlines()[0])
    add_arguments(parser)
    from dimmem.errors import run_command

    return run_command("export", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
