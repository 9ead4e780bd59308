"""LoRA SFT of a Qwen3 extractor with TRL's SFTTrainer: one readable path from dataset to adapter."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate import PartialState
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config, get_quantization_config

from dimmem.paths import RUN_CONFIG, dataset_folder
from train.answer_logits import add_answer_only_head
from train.args import QWEN3_LINEAR, DimmemArguments
from train.checkpoints import MirrorCallback, restore_run
from train.data import (
    load_sft_dataset,
    mix_tasks,
    packing_fill,
    padding_efficiency,
    prepare_split,
    task_counts,
)
from train.plot import plot_losses
from train.throughput import ThroughputMeter, attention_length, model_flops_per_token
from train.varlen_attention import NAME as SDPA_VARLEN

# Kernels that keep packed rows apart: transformers builds their per-row (block-diagonal causal) attention
# from the position_ids of a padding-free batch. Flash kernels (CUDA) and sdpa_varlen (any device,
# train/varlen_attention.py) run each sequence alone; sdpa and eager build a dense mask over the packed row
# (correct, but quadratic in its length); flex_attention a block-sparse one (no backward pass on a CPU).
PACKING_KERNELS = (
    SDPA_VARLEN,
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/vllm-flash-attn3",
    "flex_attention",
    "sdpa",
    "eager",
)


class TrainConfigError(ValueError):
    """A setting that cannot work, found before any compute is spent."""


def check_packing(sft_args: SFTConfig, model_args: ModelConfig) -> None:
    """Packed rows must not attend to each other: refuse every setting that would let them."""
    if sft_args.packing and sft_args.packing_strategy == "wrapped":
        raise TrainConfigError(
            "packing_strategy: wrapped cuts rows mid-sequence and lets them attend to each other; "
            "use packing_strategy: bfd (whole rows, kept apart), or packing: false with "
            "train_sampling_strategy: group_by_length"
        )
    if (sft_args.packing or sft_args.padding_free) and (
        model_args.attn_implementation or ""
    ) not in PACKING_KERNELS:
        raise TrainConfigError(
            f"{'packing' if sft_args.packing else 'padding_free'}: true needs an attention kernel that keeps "
            f"packed rows apart ({', '.join(PACKING_KERNELS)}); "
            f"attn_implementation is {model_args.attn_implementation!r}. "
            f"Set {SDPA_VARLEN} (any device) or a flash kernel (CUDA), or padding_free: false and "
            "packing: false (padded batches)."
        )


class DimmemSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer, with the answer-only output head when asked and a throughput meter on every step."""

    def __init__(self, *args, answer_only_logits: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.meter = ThroughputMeter()
        self.add_callback(self.meter)
        if answer_only_logits:
            model = self.model
            add_answer_only_head(model.get_base_model() if isinstance(model, PeftModel) else model)

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.meter.count(inputs)
        return super().training_step(model, inputs, num_items_in_batch)


def train(dimmem_args: DimmemArguments, sft_args: SFTConfig, model_args: ModelConfig, callbacks=None) -> Path:
    """The run, step by step: the base (built once when the config asks), the recipe's checks, the rows
    (mixed, tokenized, described), the model, TRL's trainer (resumed when asked), the adapter and the run
    record."""
    set_seed(sft_args.seed)
    state = PartialState()
    build_base(dimmem_args, model_args.model_name_or_path, sft_args.seed, state)
    check_recipe(model_args, sft_args)
    tokenizer = AutoTokenizer.from_pretrained(
        dimmem_args.tokenizer_name_or_path or model_args.model_name_or_path
    )
    train_set, eval_set, tasks = load_rows(dimmem_args, sft_args, tokenizer, state)
    if state.is_main_process:
        describe_rows(train_set, tasks, sft_args)
    model = load_model(model_args, state)
    out = Path(sft_args.output_dir)
    if dimmem_args.checkpoint_mirror:
        mirror = Path(dimmem_args.checkpoint_mirror)
        callbacks = [*(callbacks or []), MirrorCallback(mirror)]
        if dimmem_args.resume == "latest":
            with state.main_process_first():
                if state.is_main_process:
                    restore_run(mirror, out)
    trainer = make_trainer(
        model, tokenizer, train_set, eval_set, dimmem_args, sft_args, model_args, callbacks
    )
    if state.is_main_process:  # written now too: a checkpoint can be exported while the run goes on
        write_run_record(out, trainer, None, dimmem_args, sft_args, model_args, state.num_processes)
    trainer.train(resume_from_checkpoint=resume_point(dimmem_args.resume, sft_args.output_dir))
    trainer.save_model(str(out))
    lengths = [len(ids) for ids in train_set["input_ids"]]
    throughput = trainer.meter.report(
        trainer.accelerator,
        model_flops_per_token(model.config, attention_length(lengths)),
        "bfloat16" if sft_args.bf16 else str(model.dtype).removeprefix("torch."),
    )
    if state.is_main_process:
        print("throughput: " + ", ".join(f"{k} {v}" for k, v in throughput.items()))
        write_run_record(out, trainer, throughput, dimmem_args, sft_args, model_args, state.num_processes)
    return out


def build_base(dimmem_args: DimmemArguments, model_path: str, seed: int, state: PartialState) -> None:
    """A tiny random base or a packaged GGUF base written at `model_path` once (one process builds it,
    the others wait and load it); a folder built from the same spec is reused."""
    if dimmem_args.tiny_base is not None:
        with state.main_process_first():
            from train.tiny import build_tiny_base, is_built

            if not is_built(model_path, seed, **dimmem_args.tiny_base):
                build_tiny_base(
                    model_path, dataset_folder(dimmem_args.dataset_path), seed=seed, **dimmem_args.tiny_base
                )
    if dimmem_args.gguf_base is not None:
        with state.main_process_first():
            from train.gguf_base import build_gguf_base, is_built

            if not is_built(model_path, **dimmem_args.gguf_base):
                print(f"writing the pretrained base {model_path} from its GGUF file (once)")
                build_gguf_base(model_path, **dimmem_args.gguf_base)


def check_recipe(model_args: ModelConfig, sft_args: SFTConfig) -> None:
    missing = sorted(set(QWEN3_LINEAR) - set(model_args.lora_target_modules or []))
    if model_args.use_peft and missing and model_args.lora_target_modules != "all-linear":
        print(f"note: LoRA leaves {missing} frozen; the DimMem recipe adapts all seven projections")
    check_packing(sft_args, model_args)


def load_rows(dimmem_args: DimmemArguments, sft_args: SFTConfig, tokenizer, state: PartialState):
    """The training and validation rows, tasks mixed by their weights and tokenized (once: the other
    ranks reuse the datasets cache); no validation rows turn evaluation off."""
    dataset = load_sft_dataset(dimmem_args.dataset_path)
    weights, seed, limit, drop = (
        dimmem_args.task_weights,
        sft_args.seed,
        sft_args.max_length,
        dimmem_args.drop_overlong,
    )
    train_rows = mix_tasks(dataset["train"], weights, seed)
    eval_rows = mix_tasks(dataset["validation"], weights, seed) if "validation" in dataset else None
    with state.main_process_first():
        train_set = prepare_split(train_rows, tokenizer, limit, drop, "train")
        eval_set = prepare_split(eval_rows, tokenizer, limit, drop, "validation") if eval_rows else None
    if not len(train_set):
        raise TrainConfigError(f"{dimmem_args.dataset_path}: no training rows after task mixing {weights}")
    if not eval_set or not len(eval_set):
        eval_set, sft_args.eval_strategy = None, "no"
    return train_set, eval_set, task_counts(train_rows)


def describe_rows(train_set, tasks: dict, sft_args: SFTConfig) -> None:
    """What the rows cost: tokens and the share that carries loss, padding and packing."""
    tokens = sum(len(ids) for ids in train_set["input_ids"])
    answer = sum(sum(label != -100 for label in labels) for labels in train_set["labels"])
    print(f"train rows {len(train_set)} {tasks}; tokens {tokens} ({answer / tokens:.1%} carry loss)")
    grouped = sft_args.train_sampling_strategy == "group_by_length"
    batch = sft_args.per_device_train_batch_size
    print(
        f"padding efficiency (batch {batch}, {'length-grouped' if grouped else 'random'} batches): "
        f"{padding_efficiency(train_set, batch, grouped, sft_args.seed):.1%}"
        + (", padding-free: 100%" if sft_args.padding_free else "")
    )
    if sft_args.max_length:
        rows_per_bin, fill = packing_fill(train_set, sft_args.max_length)
        print(
            f"packing at max_length {sft_args.max_length} ({'on' if sft_args.packing else 'off'}): "
            f"{rows_per_bin:.1f} rows per bin, bins {fill:.1%} full"
        )


def load_model(model_args: ModelConfig, state: PartialState):
    dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
    # QLoRA (load_in_4bit): the base quantized by bitsandbytes as it loads, onto this rank's GPU
    quantization = get_quantization_config(model_args)
    return AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path,
        dtype=dtype,
        attn_implementation=model_args.attn_implementation,
        quantization_config=quantization,
        device_map={"": state.local_process_index} if quantization else None,
    )


def make_trainer(model, tokenizer, train_set, eval_set, dimmem_args, sft_args, model_args, callbacks):
    trainer_args = sft_args
    if sft_args.padding_free and not sft_args.packing:
        # prepare_split has held every row to max_length; TRL refuses a max_length it would not apply
        trainer_args = copy.copy(sft_args)
        trainer_args.max_length = None
    return DimmemSFTTrainer(
        model=model,
        args=trainer_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
        answer_only_logits=dimmem_args.answer_only_logits,
    )


def resume_point(resume: str | None, output_dir: str) -> str | None:
    """`latest`: the newest checkpoint of output_dir, or a fresh start when it has none; else as given."""
    if resume != "latest":
        return resume
    from transformers.trainer_utils import get_last_checkpoint

    found = get_last_checkpoint(output_dir) if Path(output_dir).is_dir() else None
    if found:
        print(f"resuming from {found}")
    return found


def write_run_record(
    out: Path, trainer, throughput: dict | None, dimmem_args, sft_args, model_args, world: int
) -> None:
    """dimmem_train.json (what export and the model card read) and the loss curve; before the run ends
    (`throughput` None) the record alone, without a final step."""
    model_path = model_args.model_name_or_path
    local = Path(model_path).exists()  # a local base is recorded by absolute path, a Hub one by name
    run_config = {
        "base_model": str(Path(model_path).resolve()) if local else model_path,
        "dimmem": asdict(dimmem_args),
        "model": {
            k: v for k, v in asdict(model_args).items() if k.startswith(("lora", "use_", "dtype", "attn"))
        },
        "sft": {k: getattr(sft_args, k) for k in RECORDED_SFT},
        "world_size": world,
        "final_step": trainer.state.global_step if throughput is not None else None,
        "throughput": throughput,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_CONFIG).write_text(json.dumps(run_config, indent=2, default=str) + "\n")
    if throughput is None:
        return
    plot_losses(trainer.state.log_history, out / "loss.png", f"{Path(model_path).name} LoRA SFT")


RECORDED_SFT = (  # the SFTConfig fields the run record keeps
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "max_length",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "packing",
    "padding_free",
    "train_sampling_strategy",
    "activation_checkpointing",
    "use_liger_kernel",
    "seed",
    "bf16",
)
