"""A tiny random Qwen3 with a toy-corpus tokenizer: the CPU stand-in for Qwen3-4B.

The tokenizer is the real Qwen3 one retrained on the SFT dataset's text (`train_new_from_iterator` keeps
its pre-tokenizer, special tokens and chat template byte for byte), so the vocabulary is a few hundred
tokens instead of 151k and the output layer stops dominating CPU training.
"""

from __future__ import annotations

from pathlib import Path

import torch
from datasets import load_from_disk
from transformers import Qwen3Config, Qwen3ForCausalLM

from dimmem.contract.tokens import load_tokenizer
from train.base_folder import matches, write_base

SPEC_FILE = "dimmem_tiny_base.json"


def build_tiny_base(
    out: str | Path,
    dataset_path: str | Path,
    tokenizer: str,
    seed: int = 0,
    vocab_size: int = 1000,
    hidden_size: int = 256,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 768,
    max_position_embeddings: int = 4096,
    tie_word_embeddings: bool = False,
) -> Path:
    """Write a `save_pretrained` folder (random weights + retrained tokenizer) and return its path."""
    out = Path(out)
    base = load_tokenizer(tokenizer)
    dataset = load_from_disk(str(dataset_path))
    texts = (m["content"] for split in dataset.values() for row in split for m in row["messages"])
    tok = base.train_new_from_iterator(texts, vocab_size=vocab_size)
    if tok.chat_template != base.chat_template:
        raise RuntimeError("retrained tokenizer lost the Qwen3 chat template")
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    spec = {
        "tokenizer": tokenizer,
        "seed": seed,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate_size,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
    }
    return write_base(out, model, tok, SPEC_FILE, spec)


def is_built(out: str | Path, seed: int, **spec) -> bool:
    """Whether `out` holds a tiny base built from this very spec (a changed config rebuilds it)."""
    return matches(out, SPEC_FILE, {"seed": seed, **spec})
