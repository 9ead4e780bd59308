"""Training arguments: TRL's own `SFTConfig` and `ModelConfig`, plus the few DimMem-specific knobs.

One YAML file holds all three (as in TRL's SFT script); command-line flags override it:

    dimmem train --config configs/train/tiny.yaml --max_steps 20 --learning_rate 1e-3
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from trl import ModelConfig, SFTConfig, TrlParser

# Qwen3's seven linear projections. A bare LoraConfig would adapt only q_proj and v_proj.
QWEN3_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class DimmemArguments:
    dataset_path: str = field(metadata={"help": "a datagen output folder (or its dataset/)"})
    task_weights: dict = field(
        default_factory=lambda: {"extract": 1.0, "parse_query": 1.0, "consolidate": 1.0},
        metadata={"help": "per task: fraction of its rows to train on (>1 repeats rows)"},
    )
    drop_overlong: bool = field(
        default=False, metadata={"help": "drop rows longer than max_length instead of failing"}
    )
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": "default: the model's"})
    tiny_base: dict | None = field(
        default=None,
        metadata={
            "help": (
                "build a tiny random Qwen3 at model_name_or_path when missing: "
                "train.tiny.build_tiny_base kwargs"
            )
        },
    )
    resume: str | None = field(
        default=None, metadata={"help": "'latest' or a checkpoint folder to resume from"}
    )


def parse_args(argv: list[str] | None = None) -> tuple[DimmemArguments, SFTConfig, ModelConfig]:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        # several processes and no GPU (torchrun on CPU): gloo ranks. Set before SFTConfig picks the
        # backend, or every rank silently trains alone.
        os.environ["ACCELERATE_USE_CPU"] = "true"
    parser = TrlParser((DimmemArguments, SFTConfig, ModelConfig))
    dimmem_args, sft_args, model_args = parser.parse_args_and_config(argv)
    if model_args.use_peft and not model_args.lora_target_modules:
        model_args.lora_target_modules = list(QWEN3_LINEAR)
    return dimmem_args, sft_args, model_args
