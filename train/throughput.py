"""What a training run costs: real tokens/s, padding efficiency, peak memory and, on a GPU, MFU.

Every run reports these (the log and `dimmem_train.json`), so a setting that wastes compute shows in the run
itself. Model FLOPs follow BENCHMARKS.md: a LoRA run's frozen matrices cost a forward pass and an input
gradient, 4·N per token (N: every matrix multiply including the LM head), plus causal attention forward
and backward; MFU is that work per second over the GPU's dense bf16 peak.
"""

from __future__ import annotations

import resource
import time

import torch
from transformers import PretrainedConfig, TrainerCallback


def head_dim(cfg: PretrainedConfig) -> int:
    """Width of one attention head: configs that leave it out (Qwen2's, read from a GGUF file) mean
    hidden size over heads."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def linear_params(cfg: PretrainedConfig) -> int:
    """Parameters in matrix multiplies per token (all projections and the LM head)."""
    d, h, kv, hd, ff = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        head_dim(cfg),
        cfg.intermediate_size,
    )
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * ff
    return cfg.num_hidden_layers * per_layer + d * cfg.vocab_size


def attention_flops(cfg: PretrainedConfig, seq: float) -> float:
    """Causal attention forward and backward per token, for rows of `seq` tokens."""
    return 6 * cfg.num_hidden_layers * seq * cfg.num_attention_heads * head_dim(cfg) / 2


def model_flops_per_token(cfg: PretrainedConfig, seq: float) -> float:
    """BENCHMARKS.md's model FLOPs of LoRA training: frozen base (forward, input gradients) + attention."""
    return 4 * linear_params(cfg) + attention_flops(cfg, seq)


def attention_length(lengths: list[int]) -> float:
    """The row length that gives a run's attention FLOPs per token: each token attends to those before it
    in its row, so rows weigh by their square (a fixed length gives that length)."""
    return sum(n * n for n in lengths) / max(sum(lengths), 1)


def peak_memory_gib() -> tuple[float, str]:
    """Peak GPU memory allocated by torch, or the process's peak resident memory on a CPU."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30, "cuda max allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS"


class ThroughputMeter(TrainerCallback):
    """Times each optimizer step (from its first forward to the end of the optimizer step: data loading,
    evaluation and checkpoints are left out) and counts the token slots the model computed on and the real
    (non-pad) tokens among them. The first step (warm-up) is left out of the rates when there are more.

    Each step also records the process's CPU time: on a shared CPU, wall time varies with the neighbours'
    load and CPU seconds much less."""

    def __init__(self):
        # (wall seconds, CPU seconds, real tokens, token slots) per optimizer step
        self.steps: list[tuple[float, float, int, int]] = []
        self._real = self._slots = 0
        self._started = self._cpu_started = 0.0

    def count(self, inputs: dict) -> None:
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        self._slots += ids.numel()
        # padding-free batches (packing) carry no attention mask: every position is a real token
        self._real += int(mask.sum()) if mask is not None else ids.numel()

    def on_step_begin(self, args, state, control, **kwargs):
        _sync()
        self._started, self._cpu_started = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        _sync()
        wall, cpu = time.perf_counter() - self._started, time.process_time() - self._cpu_started
        self.steps.append((wall, cpu, self._real, self._slots))
        self._real = self._slots = 0

    def report(self, accelerator, flops_per_token: float, dtype: str) -> dict:
        """The run's figures, summed over all ranks (call on every rank: it communicates)."""
        steady = self.steps[1:] if len(self.steps) > 1 else self.steps
        seconds, cpu_seconds, local_real, local_slots = (sum(column) for column in zip(*steady or [(0,) * 4]))
        local = torch.tensor(
            [local_real, local_slots, cpu_seconds], device=accelerator.device, dtype=torch.float64
        )
        real, slots, cpu_seconds = accelerator.reduce(local, reduction="sum").tolist()
        real, slots = int(real), int(slots)
        memory, memory_kind = peak_memory_gib()
        tokens_per_s = real / seconds if seconds else 0.0
        mfu = None
        if torch.cuda.is_available():
            from trl.trainer.utils import get_peak_flops

            peak = get_peak_flops(torch.cuda.get_device_name(), dtype)
            if peak:
                mfu = round(tokens_per_s * flops_per_token / (peak * accelerator.num_processes), 4)
        return {
            "steps_timed": len(steady),
            "step_s": round(seconds / max(len(steady), 1), 4),
            "real_tokens": real,
            "token_slots": slots,
            "padding_efficiency": round(real / slots, 4) if slots else None,
            "real_tokens_per_s": round(tokens_per_s, 1),
            "real_tokens_per_cpu_s": round(real / cpu_seconds, 1) if cpu_seconds else None,
            "peak_memory_gib": round(memory, 2),
            "peak_memory_kind": memory_kind,
            "model_tflops_per_token": round(flops_per_token / 1e12, 9),
            "mfu": mfu,
        }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
