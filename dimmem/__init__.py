"""DimMem: atomic, typed memory records with explicit dimensions, and the pipeline around a compact extractor.

Layers (ARCHITECTURE.md): `dimmem.contract` (the record contract), `dimmem.runtime` (the memory runtime,
`from dimmem.runtime import Memory`), shared infrastructure beside them (`dimmem.config`, `dimmem.llm`,
`dimmem.cache`), and the stages above (data_gen, train, eval, serve)."""

__version__ = "0.1.0"
