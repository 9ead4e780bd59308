"""The memory runtime: `Memory(config)` over a store, retrieval, query parsing and consolidation.

    from dimmem.runtime import Memory, MemoryConfig

The names load on first use, so importing `dimmem.runtime.cli` stays light.
"""

from __future__ import annotations

from importlib import import_module

_EXPORTS = {
    "Memory": "dimmem.runtime.memory",
    "Page": "dimmem.runtime.memory",
    "AddResult": "dimmem.runtime.memory",
    "SearchResult": "dimmem.runtime.memory",
    "SearchFilters": "dimmem.runtime.search",
    "MemoryConfig": "dimmem.runtime.config",
    "label_memories": "dimmem.runtime.labels",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
