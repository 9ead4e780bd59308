"""Vectors by record id as the rows of one float32 matrix that doubles as it grows: a record's hundreds of
candidates are scored by one indexed product instead of stacked from as many arrays, and adding a batch
copies the held rows only when the capacity runs out (amortised O(1) a row)."""

from __future__ import annotations

import numpy as np


class VectorRows:
    def __init__(self) -> None:
        self.row: dict[str, int] = {}  # record id -> its row (the latest, when an id was given again)
        self.matrix: np.ndarray | None = None  # (capacity, dimension); rows from `used` on are unused
        self.used = 0

    def __len__(self) -> int:
        return self.used

    def get(self, record_id: str) -> np.ndarray | None:
        row = self.row.get(record_id)
        return None if row is None else self.matrix[row].copy()

    def rows(self, record_ids: list[str]) -> np.ndarray:
        return self.matrix[list(map(self.row.__getitem__, record_ids))]

    def put(self, record_id: str, vector: np.ndarray) -> None:
        self.extend([record_id], np.asarray(vector, dtype=np.float32)[None])

    def extend(self, record_ids: list[str], matrix: np.ndarray) -> None:
        """Rows for the ids, in order (a new vector for a held id takes a new row; the old one stays)."""
        if not record_ids:
            return
        start, end = self.used, self.used + len(record_ids)
        if self.matrix is None or end > len(self.matrix):
            self._grow(max(2 * end, 256), matrix.shape[1])
        self.matrix[start:end] = matrix
        self.row.update(zip(record_ids, range(start, end)))
        self.used = end

    def pop(self, record_id: str) -> int | None:
        """Forget the id; its row, if it had one."""
        return self.row.pop(record_id, None)

    def _grow(self, capacity: int, dimension: int) -> None:
        grown = np.zeros((capacity, dimension), dtype=np.float32)
        if self.matrix is not None:
            grown[: self.used] = self.matrix[: self.used]
        self.matrix = grown
