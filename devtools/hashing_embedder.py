"""A stand-in for the embedder where only the store's behaviour matters (tests, store benchmarks): each
word hashed to one of the model's `WIDTH` dimensions, unit length. Texts sharing words are close, at no
model cost; `seconds_per_text` makes it as slow as a real model on a small CPU (sleeping, as the real one
releases the GIL)."""

from __future__ import annotations

import re
import time
import zlib

import numpy as np

from dimmem.runtime.embed import WIDTH


class HashingEmbedder:
    def __init__(self, seconds_per_text: float = 0.0):
        self.seconds_per_text = seconds_per_text

    def encode(self, texts: list[str]) -> np.ndarray:
        time.sleep(self.seconds_per_text * len(texts))
        out = np.zeros((len(texts), WIDTH), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                out[row, zlib.crc32(word.encode()) % WIDTH] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
