"""LoRA SFT of a Qwen3 extractor with TRL's SFTTrainer: one readable path from dataset to adapter."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate import PartialState
from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

from dimmem.paths import dataset_folder
from train.args import QWEN3_LINEAR, DimmemArguments
from train.data import (
    load_sft_dataset,
    mix_tasks,
    packing_efficiency,
    padding_efficiency,
    prepare_split,
    task_counts,
)
from train.export import RUN_CONFIG
from train.plot import plot_losses

PACKING_KERNELS = (
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/vllm-flash-attn3",
)


class TrainConfigError(ValueError):
    """A setting that cannot work, found before any compute is spent."""


def check_packing(sft_args: SFTConfig, model_args: ModelConfig) -> None:
    """Packed rows must not attend to each other: that needs a varlen (flash) attention kernel."""
    if sft_args.packing and (model_args.attn_implementation or "") not in PACKING_KERNELS:
        raise TrainConfigError(
            "packing: true needs an attention kernel that keeps packed rows apart "
            f"({', '.join(PACKING_KERNELS[:2])}); "
            f"attn_implementation is {model_args.attn_implementation!r}. "
            "Set packing: false (rows are then padded per batch), "
            "or attn_implementation: flash_attention_2 on a GPU with flash-attn installed."
        )


def train(dimmem_args: DimmemArguments, sft_args: SFTConfig, model_args: ModelConfig, callbacks=None) -> Path:
    set_seed(sft_args.seed)
    state = PartialState()
    model_path = model_args.model_name_or_path
    if dimmem_args.tiny_base is not None:
        with state.main_process_first():  # one process builds it, the others wait and load it
            from train.tiny import build_tiny_base, is_built

            if not is_built(model_path, sft_args.seed, **dimmem_args.tiny_base):
                build_tiny_base(
                    model_path,
                    dataset_folder(dimmem_args.dataset_path),
                    seed=sft_args.seed,
                    **dimmem_args.tiny_base,
                )
    missing = sorted(set(QWEN3_LINEAR) - set(model_args.lora_target_modules or []))
    if model_args.use_peft and missing and model_args.lora_target_modules != "all-linear":
        print(f"note: LoRA leaves {missing} frozen; the DimMem recipe adapts all seven projections")
    check_packing(sft_args, model_args)

    tokenizer = AutoTokenizer.from_pretrained(dimmem_args.tokenizer_name_or_path or model_path)
    dataset = load_sft_dataset(dimmem_args.dataset_path)
    train_rows = mix_tasks(dataset["train"], dimmem_args.task_weights, sft_args.seed)
    eval_rows = (
        mix_tasks(dataset["validation"], dimmem_args.task_weights, sft_args.seed)
        if "validation" in dataset
        else None
    )
    with state.main_process_first():  # tokenize once, the other ranks reuse the datasets cache
        train_set = prepare_split(
            train_rows, tokenizer, sft_args.max_length, dimmem_args.drop_overlong, "train"
        )
        eval_set = (
            prepare_split(eval_rows, tokenizer, sft_args.max_length, dimmem_args.drop_overlong, "validation")
            if eval_rows
            else None
        )
    if not len(train_set):
        raise TrainConfigError(
            f"{dimmem_args.dataset_path}: no training rows after task mixing {dimmem_args.task_weights}"
        )
    if not eval_set or not len(eval_set):
        eval_set, sft_args.eval_strategy = None, "no"
    if state.is_main_process:
        tokens = sum(len(ids) for ids in train_set["input_ids"])
        answer = sum(sum(label != -100 for label in labels) for labels in train_set["labels"])
        print(
            f"train rows {len(train_set)} {task_counts(train_rows)}; "
            f"tokens {tokens} ({answer / tokens:.1%} carry loss)"
        )
        print(
            f"padding efficiency (batch {sft_args.per_device_train_batch_size}): "
            f"{padding_efficiency(train_set, sft_args.per_device_train_batch_size):.1%}"
        )
        if sft_args.max_length:
            print(
                f"packing efficiency at max_length {sft_args.max_length}: "
                f"{packing_efficiency(train_set, sft_args.max_length):.1%}"
                f" ({'on' if sft_args.packing else 'off'})"
            )

    dtype = model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype)
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=dtype, attn_implementation=model_args.attn_implementation
    )
    trainer = SFTTrainer(
        model=model,
        args=sft_args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    resume = True if dimmem_args.resume == "latest" else dimmem_args.resume
    trainer.train(resume_from_checkpoint=resume)
    out = Path(sft_args.output_dir)
    trainer.save_model(str(out))
    if state.is_main_process:
        local = Path(model_path).exists()  # a local base is recorded by absolute path, a Hub one by name
        run_config = {
            "base_model": str(Path(model_path).resolve()) if local else model_path,
            "dimmem": asdict(dimmem_args),
            "model": {
                k: v for k, v in asdict(model_args).items() if k.startswith(("lora", "use_", "dtype", "attn"))
            },
            "sft": {
                k: getattr(sft_args, k)
                for k in (
                    "learning_rate",
                    "num_train_epochs",
                    "max_steps",
                    "max_length",
                    "per_device_train_batch_size",
                    "gradient_accumulation_steps",
                    "packing",
                    "seed",
                    "bf16",
                )
            },
            "world_size": state.num_processes,
            "final_step": trainer.state.global_step,
        }
        (out / RUN_CONFIG).write_text(json.dumps(run_config, indent=2, default=str) + "\n")
        plot_losses(trainer.state.log_history, out / "loss.png", f"{Path(model_path).name} LoRA SFT")
    return out
