"""The dense index `pgvector` (Postgres): the active records' vectors in `record_vectors`, searched by
pgvector's HNSW graph (cosine) in the database, so no process keeps a copy of them."""

from __future__ import annotations

from typing import Any

import numpy as np

from dimmem.runtime.embed import WIDTH as DIMENSIONS  # the embedding column
from dimmem.runtime.stores.base import Sql, chunks

_AGGREGATED = 10_000  # ids per aggregated read: 15 MB of vectors, far below a value's 1 GB bound


def _vector(vector: np.ndarray) -> np.ndarray:
    """A vector as the store's float32 (sent in pgvector's binary format: the dialect registers it)."""
    values = np.asarray(vector, dtype=np.float32).ravel()
    if values.size != DIMENSIONS:
        raise ValueError(f"vector of {values.size} dimensions; the store holds {DIMENSIONS}")
    return values


def _from_send(data: bytes, n: int) -> np.ndarray:
    """n vectors in pgvector's binary form (a 2-byte dimension, 2 bytes unused, big-endian float4s), joined,
    as a float32 matrix."""
    rows = np.frombuffer(data, dtype=np.uint8).reshape(n, -1)
    return rows[:, 4:].copy().view(">f4").astype(np.float32)


class PgVectors:
    name, kind = "pgvector", "dense"
    concurrent = True  # a pooled connection of its own per search

    def __init__(self, log: Any):
        self.log = log
        self.iterative_scan = log.dialect.pgvector_version() >= (0, 8)  # complete filtered HNSW results

    @classmethod
    def from_options(cls, log: Any, options: dict) -> PgVectors:
        return cls(log)

    def upsert(self, sql: Sql, user_id: str, record: dict, vector: np.ndarray | None) -> None:
        if vector is not None:  # (a copied record without a vector: found by the other paths only)
            sql.run(
                "INSERT INTO record_vectors (user_id, record_id, embedding) VALUES (?, ?, ?::vector)",
                (user_id, record["id"], _vector(vector)),
            )

    def remove(self, sql: Sql, user_id: str, record_id: str) -> None:
        sql.run("DELETE FROM record_vectors WHERE {user} AND record_id=?", (user_id, record_id))

    def clear(self, sql: Sql, user_id: str) -> None:
        sql.run("DELETE FROM record_vectors WHERE {user}", (user_id,))

    def search(self, user_id: str, query: np.ndarray, k: int) -> list[tuple[str, float]]:
        """The `k` active records nearest by cosine: (id, cosine similarity), best first."""
        with self.log.dialect.cursor(user_id) as sql:
            sql.run("SELECT set_config('hnsw.ef_search', ?, true)", (str(min(max(40, k), 1000)),))
            if self.iterative_scan:  # keep scanning the graph until k rows pass the user filter
                sql.run("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
            q = _vector(query)
            rows = sql.rows(
                "SELECT record_id, 1 - (embedding <=> ?::vector) AS score FROM record_vectors "
                "WHERE {user} ORDER BY embedding <=> ?::vector LIMIT ?",
                (q, user_id, q, k),
            )
        return [(r["record_id"], float(r["score"])) for r in rows]

    def vectors(self, sql: Sql, user_id: str, record_ids: list[str] | None) -> tuple[list[str], np.ndarray]:
        """(ids, matrix) of the given (None: all) active records' vectors, ordered by id. Given ids, the
        update path's thousands a batch: one row of the ids and their vectors' binary forms joined, read as
        one array (a row and a vector object apiece cost more than the database's work). Two statements,
        not one with `? IS NULL OR record_id = ANY(?)`: a prepared statement's generic plan cannot drop that
        OR, so it tested every row of the user against the whole id list (10x slower at 1e4 records)."""
        if record_ids is None:
            rows = sql.rows(
                "SELECT record_id, embedding FROM record_vectors WHERE {user} ORDER BY record_id",
                (user_id,),
                binary=True,  # pgvector's binary format: float32 bytes, exact, no parsing of numbers
            )
            if not rows:
                return [], np.zeros((0, 0), dtype=np.float32)
            return [r["record_id"] for r in rows], np.stack([r["embedding"].to_numpy() for r in rows])
        ids: list[str] = []
        parts: list[np.ndarray] = []
        for chunk in chunks(sorted(set(record_ids)), _AGGREGATED):
            found = sql.row(
                "SELECT array_agg(record_id ORDER BY record_id) AS ids, "
                "string_agg(vector_send(embedding), ''::bytea ORDER BY record_id) AS vecs "
                "FROM record_vectors WHERE {user} AND record_id = ANY(?::text[])",
                (user_id, chunk),
                binary=True,
            )
            if found and found["ids"]:
                ids += found["ids"]
                parts.append(_from_send(bytes(found["vecs"]), len(found["ids"])))
        if not ids:
            return [], np.zeros((0, 0), dtype=np.float32)
        return ids, np.concatenate(parts)

    def closest(
        self, sql: Sql, user_id: str, query: np.ndarray, record_ids: list[str], k: int
    ) -> list[tuple[str, float]]:
        """The k of the given records nearest the query, scored in the database: the vectors are unit
        length, so the inner product (`<#>`, its negative) is the cosine, and no row leaves but k scores."""
        q = _vector(query)
        rows = sql.rows(
            "SELECT record_id, -(embedding <#> ?::vector) AS score FROM record_vectors "
            "WHERE {user} AND record_id = ANY(?::text[]) ORDER BY embedding <#> ?::vector, record_id LIMIT ?",
            (q, user_id, record_ids, q, k),
        )
        return [(r["record_id"], float(r["score"])) for r in rows]

    def close(self) -> None:
        pass
