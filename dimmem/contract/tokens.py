"""The target tokenizer and chat template, rendered exactly as training and serving do.

Qwen3 is a hybrid thinking model: every stage renders with thinking disabled (`CHAT_TEMPLATE_KWARGS`).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # transformers loads only when a tokenizer is needed
    from transformers import PreTrainedTokenizerBase

CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}


@cache
def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except OSError as exc:
        raise OSError(
            f"could not load tokenizer {name_or_path!r} ({exc}); "
            "offline, pass a local folder with --tokenizer"
        ) from exc


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> str:
    """The text the model reads before its answer (generation prompt included, thinking off)."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **CHAT_TEMPLATE_KWARGS
    )


@cache  # once per tokenizer object, not once per training row
def end_of_turn(tokenizer: PreTrainedTokenizerBase) -> str:
    """The special token that closes an assistant turn in the tokenizer's chat template (`<|im_end|>` in
    Qwen3's and SmolLM2's ChatML): the answer's last training token, and where generation stops."""
    sentinel = "DIMMEM_ANSWER_SENTINEL"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": sentinel}],
        tokenize=False,
        **CHAT_TEMPLATE_KWARGS,
    )
    after = text[text.rindex(sentinel) + len(sentinel) :]
    special = sorted((after.find(token), token) for token in tokenizer.get_added_vocab() if token in after)
    if not special:
        raise ValueError(
            f"{tokenizer.name_or_path}: its chat template closes an answer with no special token"
        )
    return special[0][1]  # the first one after the answer


def count_prompt_tokens(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> int:
    return len(tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"])
