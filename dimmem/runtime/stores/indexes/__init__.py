"""The retrieval indexes a record log keeps (`base.Index`), chosen by name: one lexical and one dense.

    bm25      lexical, both backends: each user's postings in memory, BM25, following the log's change
              numbers (bm25.py)
    memory    dense, SQLite: each user's vectors in memory (exact, or faiss HNSW for large users), stored
              in the file's `vectors` table (memory_vectors.py)
    pgvector  dense, Postgres: pgvector's HNSW graph in the database (pgvector.py)

A further index (Qdrant, LanceDB, tantivy, ...) is one module with the `Index` methods and a line here.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# name -> (module, class, the path it serves, the dialects whose tables it uses)
INDEXES: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "bm25": ("bm25", "LexicalIndex", "lexical", ("sqlite", "postgres")),
    "memory": ("memory_vectors", "MemoryVectors", "dense", ("sqlite",)),
    "pgvector": ("pgvector", "PgVectors", "dense", ("postgres",)),
}
DEFAULTS = {
    "sqlite": {"lexical": "bm25", "dense": "memory"},
    "postgres": {"lexical": "bm25", "dense": "pgvector"},
}


def open_indexes(log: Any, names: dict[str, str] | None, options: dict[str, Any]) -> dict[str, Any]:
    """{"lexical": index, "dense": index} for the log's dialect: the names given, else its defaults.
    `options` (e.g. ann_min_records) are read by the indexes they concern."""
    chosen = {**DEFAULTS[log.dialect.name], **(names or {})}
    if unknown := set(chosen) - {"lexical", "dense"}:
        raise ValueError(f"indexes: unknown path(s) {sorted(unknown)}; expected lexical and dense")
    out = {}
    for path, name in chosen.items():
        if name not in INDEXES:
            raise ValueError(f"indexes.{path}: unknown index {name!r}; known: {sorted(INDEXES)}")
        module, cls, serves, dialects = INDEXES[name]
        if serves != path:
            raise ValueError(f"indexes.{path}: {name!r} is a {serves} index")
        if log.dialect.name not in dialects:
            raise ValueError(
                f"indexes.{path}: {name!r} runs on {' or '.join(dialects)}, not {log.dialect.name}"
            )
        out[path] = getattr(import_module(f"{__name__}.{module}"), cls).from_options(log, options)
    return out
