"""Training arguments: TRL's own `SFTConfig` and `ModelConfig`, plus the few DimMem-specific knobs.

One YAML file holds all three (as in TRL's SFT script); command-line flags override it:

    dimmem train --config configs/train/tiny.yaml --max_steps 20 --learning_rate 1e-3
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from dataclasses import dataclass, field

import torch
from trl import ModelConfig, SFTConfig, TrlParser

from dimmem.config import ConfigError, read_yaml

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
    gguf_base: dict | None = field(
        default=None,
        metadata={
            "help": (
                "write a pretrained base shipped as a GGUF file in an installed package to "
                "model_name_or_path when missing: train.gguf_base.build_gguf_base kwargs"
            )
        },
    )
    resume: str | None = field(
        default=None, metadata={"help": "'latest' or a checkpoint folder to resume from"}
    )
    checkpoint_mirror: str | None = field(
        default=None,
        metadata={
            "help": "a folder kept beyond this machine (e.g. committed): after each save it holds the newest "
            "checkpoint and the best one's adapter; `resume: latest` restores them first (train.checkpoints)"
        },
    )
    answer_only_logits: bool = field(
        default=False,
        metadata={
            "help": "project only the answer positions onto the vocabulary (train.answer_logits); "
            "same loss and gradients, a fraction of the output layer's work"
        },
    )


CPU_PROFILE = "configs/train/tiny.yaml"


class Parser(TrlParser):
    """TRL's parser (its YAML, its flags, its `env:` block), with every mistake one line that names the
    config file (and line): a missing, broken, empty or non-mapping file, a key no dataclass knows, a value
    of the wrong type, a bad flag. `--help` is TRL's full flag list."""

    def __init__(self, prog: str = "dimmem train"):
        super().__init__((DimmemArguments, SFTConfig, ModelConfig), prog=prog)
        self.config_path: str | None = None
        self.config_keys: set[str] = set()
        self.config_raw: dict = {}
        self.flags_given: set[str] = set()

    def parse_args_and_config(self, args=None, **kwargs):
        args = list(sys.argv[1:] if args is None else args)
        for i, arg in enumerate(args):  # TRL reads `--config PATH` only
            if arg.startswith("--config="):
                args[i : i + 1] = ["--config", arg.partition("=")[2]]
        self.flags_given = {a[2:].partition("=")[0].replace("-", "_") for a in args if a.startswith("--")}
        if "--config" in args:
            at = args.index("--config")
            if at + 1 >= len(args) or args[at + 1].startswith("--"):
                self.error("--config needs a file, e.g. --config configs/train/tiny.yaml")
            self.config_path = args[at + 1]
            self.check_config(self.config_path)
        return super().parse_args_and_config(args, **kwargs)

    def check_config(self, path: str) -> None:
        raw = read_yaml(path)  # missing, unreadable, broken (with its line), or not a mapping: one line
        if not raw:
            raise ConfigError(
                f"{path}: empty config file: expected TRL's SFTConfig/ModelConfig fields and dataset_path "
                f"(see {CPU_PROFILE})"
            )
        known = {action.dest for action in self._actions} | {"env"}
        if unknown := sorted(str(key) for key in raw if key not in known):
            raise ConfigError(
                f"{path}: unknown key(s) {', '.join(map(repr, unknown))}: not a field of TRL's SFTConfig or "
                f"ModelConfig or of the DimMem arguments (dimmem train --help lists them)"
            )
        self.config_keys = set(raw)
        self.config_raw = raw

    def error(self, message: str):
        """argparse's usage error, in one line (TRL's usage lists some 300 flags); a bad value that came
        from the config file names the file."""
        flag = re.match(r"argument --([\w-]+)", message)
        if (
            flag
            and (key := flag.group(1).replace("-", "_")) in self.config_keys
            and key not in self.flags_given
        ):
            message += f" (set in {self.config_path})"
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


# Settings that run on a CUDA GPU only, in the order a refusal names them (the first one set).
GPU_ONLY = {
    "use_liger_kernel": "use_liger_kernel: true (Liger's Triton kernels)",
    "load_in_4bit": "load_in_4bit: true (QLoRA's 4-bit base, bitsandbytes)",
    "load_in_8bit": "load_in_8bit: true (an 8-bit base, bitsandbytes)",
}


def gpu_only(fields: dict) -> str | None:
    """The first setting in `fields` (a config file's, or the parsed arguments') that needs a CUDA GPU."""
    attention = str(fields.get("attn_implementation") or "")
    found = [what for key, what in GPU_ONLY.items() if fields.get(key) is True]
    # flash kernels are CUDA's; FlexAttention runs forward only on a CPU (no backward pass)
    found += [f"attn_implementation: {attention}"] if "flash" in attention or "flex" in attention else []
    found += ["bf16: true"] if fields.get("bf16") is True else []
    return found[0] if found else None


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (avx512_bf16 or AMX), where the CPU profiles'
    bf16 autocast pays (2.3x in BENCHMARKS.md)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def gpu_needed(config: str | None, what: str) -> ConfigError:
    where = f"{config}: " if config else ""
    return ConfigError(
        f"{where}{what} needs a GPU and none is available: this recipe is for GPU machines; "
        f"on a CPU train with the CPU profile, dimmem train --config {CPU_PROFILE}"
    )


def parse_args(argv: list[str] | None = None) -> tuple[DimmemArguments, SFTConfig, ModelConfig]:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        # several processes and no GPU (torchrun on CPU): gloo ranks. Set before SFTConfig picks the
        # backend, or every rank silently trains alone.
        os.environ["ACCELERATE_USE_CPU"] = "true"
    # TRL's SFTConfig defaults gradient_checkpointing=True, which transformers 5 warns about on every
    # config that does not set activation_checkpointing: not the user's doing, and not theirs to fix
    warnings.filterwarnings(
        "ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning
    )
    parser = Parser()
    try:
        dimmem_args, sft_args, model_args = parser.parse_args_and_config(argv)
    except ConfigError:
        raise
    except ValueError as exc:  # SFTConfig's and TrainingArguments' own checks
        if str(exc).startswith("Some specified arguments are not used"):  # HfArgumentParser's words
            parser.error(f"unrecognized arguments: {str(exc).partition(': ')[2]}")
        if "bf16" in str(exc):  # the first GPU-only setting of the file, which may be bf16 itself
            what = gpu_only({**parser.config_raw, "bf16": True})
            raise gpu_needed(parser.config_path, what) from None
        raise ConfigError(f"{parser.config_path or 'dimmem train'}: {exc}") from None
    if not torch.cuda.is_available() and (
        what := gpu_only({**vars(model_args), "use_liger_kernel": sft_args.use_liger_kernel})
    ):
        raise gpu_needed(parser.config_path, what)
    if sft_args.bf16 and sft_args.use_cpu and not cpu_has_bf16():
        # emulated on such a CPU, bf16 autocast is about 20x slower than float32 (an AVX2 core here)
        print(
            f"{parser.config_path or 'dimmem train'}: bf16: true asks for bf16 autocast, which this CPU "
            "lacks (no avx512_bf16 or AMX): training in float32",
            file=sys.stderr,
        )
        sft_args.bf16, sft_args.mixed_precision = False, "no"
    if dimmem_args.gguf_base is not None:
        check_gguf_base(parser.config_path or "dimmem train", dimmem_args)
    if model_args.use_peft and not model_args.lora_target_modules:
        model_args.lora_target_modules = list(QWEN3_LINEAR)
    return dimmem_args, sft_args, model_args


def check_gguf_base(where: str, dimmem_args: DimmemArguments) -> None:
    """`gguf_base` names the keys `build_gguf_base` takes, and is not asked for beside a tiny random base."""
    import inspect

    from train.gguf_base import build_gguf_base

    if dimmem_args.tiny_base is not None:
        raise ConfigError(f"{where}: tiny_base and gguf_base both build the base model; keep one")
    params = inspect.signature(build_gguf_base).parameters
    required = {name for name, p in params.items() if p.default is inspect.Parameter.empty} - {"out"}
    given = set(dimmem_args.gguf_base)
    if unknown := sorted(given - set(params) - {"out"}):
        takes = ", ".join(sorted(set(params) - {"out"}))
        raise ConfigError(f"{where}: gguf_base: unknown key(s) {', '.join(unknown)} (it takes {takes})")
    if missing := sorted(required - given):
        raise ConfigError(f"{where}: gguf_base: missing {', '.join(missing)}")
