"""Logits only where the loss is: the output projection runs on the answer positions alone.

Only the JSON answer carries loss (about 20% of the tokens in the toy data, 7% at 8k tokens), yet a causal
LM's forward projects every position onto the whole vocabulary. TRL's SFTTrainer routes training through a
fused LM head (`model(..., fused_lm_head=True)`), but off CUDA/XPU that head scores every position. This one
gathers the hidden states whose next-token label is not -100 and projects only those, calling the output
layer as a module: PEFT's wrappers (LoRA on the head, `modules_to_save`) and DeepSpeed ZeRO-3's parameter
gathering see an ordinary forward, and autograd an ordinary graph. TRL's loss, metrics and token counts are
unchanged: it gets the same `FusedCausalLMOutput`.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from trl.trainer.utils import FusedCausalLMOutput


def add_answer_only_head(model: torch.nn.Module) -> None:
    """Patch `model` (the causal LM under PEFT, after TRL has added its fused head) so that calls with
    `fused_lm_head=True` project the answer positions only. Any other call goes to the forward it had."""
    previous = model.forward

    def forward(self, *args, fused_lm_head=False, labels=None, num_items_in_batch=None, **kwargs):
        if (
            not fused_lm_head
            or labels is None
            or "shift_labels" in kwargs
            or kwargs.get("output_router_logits")
        ):
            # generation, eval without labels, context parallelism (pre-shifted labels), MoE router losses
            return previous(
                *args,
                fused_lm_head=fused_lm_head,
                labels=labels,
                num_items_in_batch=num_items_in_batch,
                **kwargs,
            )
        kwargs["use_cache"] = False
        hidden = self.base_model(*args, **kwargs).last_hidden_state[:, :-1]
        targets = labels[:, 1:].to(hidden.device)
        mask = targets != -100
        answer = targets[mask]
        logits = self.get_output_embeddings()(hidden[mask]).float()
        nll = F.cross_entropy(logits, answer, reduction="none")
        with torch.no_grad():  # TRL's logged metrics, on the same positions
            log_p = logits.log_softmax(-1)
            entropy = -(log_p.exp() * log_p).sum(-1)
            is_top1 = logits.argmax(-1) == answer

        def spread(values: torch.Tensor) -> torch.Tensor:
            # `masked_scatter` keeps a batch without answer tokens in the graph (a zero loss, not an error)
            return values.new_zeros(mask.shape).masked_scatter(mask, values)

        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        return FusedCausalLMOutput(
            loss=nll.sum() / count,
            log_probs=spread(-nll),
            entropy=spread(entropy),
            is_top1=spread(is_top1),
            label_mask=mask,
        )

    model.forward = types.MethodType(forward, model)
