"""The runtime's configuration: every default of a `Memory` lives here, nowhere else. A YAML file
(`configs/memory/*.yaml`), a dict or nothing at all builds one (`Memory(config)`,
`Memory.from_config(path, overrides)`).

One `model` section (`dimmem.llm.ModelConfig`) names the endpoint that serves the DimMem tasks (the
compact extractor answers all three); `extractor`, `query_parser` and `consolidator` each choose it or
their fallback. The API key is read from the environment variable `api_key_env` names, never from
the file.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dimmem.config import Section, WindowConfig, load_config
from dimmem.contract.formats import ExtractFormatName
from dimmem.llm import ModelConfig
from dimmem.runtime.backends import backend, help_lines

SQLITE_URL = "sqlite:///"
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class RetrievalConfig(Section):
    depth: int = Field(50, ge=1, description="candidates each path contributes to fusion")
    fusion: Literal["score", "rrf", "dedup"] = Field(
        "score",
        description="score: sum of the paths' calibrated scores; rrf: reciprocal rank fusion; dedup: the "
        "DimMem authors' rule, a baseline (each path's top dedup_k, concatenated, duplicates dropped); "
        "BENCHMARKS.md compares them",
    )
    dedup_k: int = Field(
        15, ge=1, description="fusion dedup: records each path contributes (the authors': 15)"
    )
    weights: dict[str, float] | None = Field(None, description="per-path weights of the fusion; null: all 1")
    ann_min_records: int = Field(
        200_000, ge=1, description="a user's dense search switches from exact to HNSW here"
    )


class EmbedderConfig(Section):
    """The dense embedder (`dimmem.runtime.embed`); BENCHMARKS.md compares the backends and precisions."""

    model: str | None = Field(
        None, description="sentence-transformers name or folder; null: all-MiniLM-L6-v2 (shipped offline)"
    )
    backend: Literal["onnx", "torch"] = Field(
        "onnx",
        description="onnx: ONNX Runtime over a cached export (same vectors); torch: sentence-transformers",
    )
    precision: Literal["fp32", "int8"] = Field(
        "fp32", description="int8: a quantized export (onnx only): faster, vectors at cosine ~0.99"
    )
    threads: int | None = Field(
        None, ge=1, description="intra-op threads of this process (each worker); null: every core"
    )
    batch_size: int = Field(
        16, ge=1, description="texts per forward pass (shortest first: small batches pad least)"
    )

    @model_validator(mode="after")
    def _supported(self) -> EmbedderConfig:
        if self.precision == "int8" and self.backend != "onnx":
            raise ValueError("embedder: precision int8 needs backend onnx")
        return self


class UpdateConfig(Section):
    candidates: Literal["dimmem", "paper"] = Field(
        "dimmem",
        description="dimmem: same type, a shared keyword besides the speaker's name, same speaker, cosine "
        "from similarity_threshold; paper: the DimMem authors' filter, a baseline (same type, keyword "
        "Jaccard from paper_jaccard, cosine from paper_similarity, never a record of a later session)",
    )
    similarity_threshold: float = Field(
        0.6, description="the closest candidate from this cosine on is the one the consolidator decides on"
    )
    restate_similarity: float = Field(
        0.88, ge=-1, le=1, description="rules: a restatement (MERGE) from this cosine on ..."
    )
    restate_overlap: float = Field(
        0.7,
        ge=0,
        le=1,
        description="... with this share of the shorter record's content words in the other "
        "(benchmarks/update.py: the two set on the labeled LoCoMo pairs, checked on a second set)",
    )
    max_candidates: int = Field(200, ge=1, description="update candidates compared by embedding, at most")
    paper_jaccard: float = Field(0.3, ge=0, le=1, description="candidates paper: keyword Jaccard from here")
    paper_similarity: float = Field(0.7, ge=-1, le=1, description="candidates paper: cosine from this on")


class StudentConfig(Section):
    """The shipped student as the extractor (`extractor: student`, dimmem/runtime/student.py): llama.cpp on
    this machine, its base assembled from PyPI packages on first use."""

    folder: str | None = Field(
        None, description="a student adapter export (adapter.gguf, dimmem_train.json); null: the shipped one"
    )
    threads: int | None = Field(None, ge=1, description="CPU threads of llama.cpp; null: every core")
    parallel: int = Field(1, ge=1, description="windows decoded together (llama.cpp slots)")
    context: int = Field(
        6144, ge=512, description="tokens per window: the longest 25/5 LoCoMo prompt (3.2k) and the answer"
    )
    max_tokens: int = Field(2048, ge=1, description="answer budget per window")
    timeout: float = Field(1800.0, gt=0, description="seconds one window may take (a CPU is slow)")
    startup_timeout: float = Field(
        300.0, gt=0, description="seconds llama.cpp may take to load (and, the first time, to merge)"
    )
    merge: bool = Field(
        True,
        description="serve the base with the adapter folded in (built once, cached; its weights in Q8_0), "
        "faster on a CPU; false: the adapter applied at run time over the base, as trained",
    )
    portable: bool = Field(
        False,
        description="the wheel's llama.cpp even where one compiled for this CPU (`make llamacpp-native`) "
        "is present; false: that build when present, faster on a CPU with AVX-512",
    )


class PoolConfig(Section):
    """Postgres connections of one process (each worker has its own pool); SQLite ignores it."""

    min: int = Field(1, ge=0, description="connections kept open")
    max: int = Field(10, ge=1, description="at most; N workers on M machines open up to max·N·M")

    @model_validator(mode="after")
    def _ordered(self) -> PoolConfig:
        if self.min > self.max:
            raise ValueError(f"pool: min {self.min} is above max {self.max}")
        return self


def _check_store(value: str) -> str:
    if "://" in value and not value.startswith((SQLITE_URL, *POSTGRES_SCHEMES)):
        raise ValueError(
            f"{value.split('://')[0]!r} stores are not supported: use a SQLite file path, {SQLITE_URL}PATH, "
            ":memory: or postgresql://..."
        )
    if value in ("", SQLITE_URL, *POSTGRES_SCHEMES):
        raise ValueError("empty store path")
    return value


class MemoryConfig(Section):
    store: str = Field(
        "memories.sqlite",
        description="SQLite file, `sqlite:///path`, `:memory:`, or `postgresql://...` (Postgres + pgvector)",
    )
    store_env: str | None = Field(
        None,
        description="environment variable holding the store URL (no password in the file); wins over the "
        "file's `store`, and a store the command names (--store, a service's `store:`) wins over both",
    )
    indexes: dict[Literal["lexical", "dense"], str] | None = Field(
        None,
        description="the retrieval indexes by name (dimmem.runtime.stores.indexes): lexical bm25; dense "
        "memory (SQLite) or pgvector (Postgres); null: the store's defaults",
    )
    embedder: EmbedderConfig = EmbedderConfig()
    model: ModelConfig | None = Field(None, description="the endpoint of the 'model' components")
    extractor: str = Field("turns", description="the extraction backend: " + help_lines())
    student: StudentConfig = StudentConfig()
    extractor_format: ExtractFormatName = Field(
        "dimmem",
        description="what the 'model' extractor speaks: dimmem (this contract), or the DimMem authors' "
        "dimmem-paper (LoCoMo checkpoint) / dimmem-paper-longmemeval (user messages only)",
    )
    labels: str | None = Field(None, description="a data_gen labels.jsonl for the replay extractor")
    query_parser: Literal["model", "rules"] = "rules"
    consolidator: Literal["model", "rules"] = "rules"
    windows: WindowConfig = WindowConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    update: UpdateConfig = UpdateConfig()
    pool: PoolConfig = PoolConfig()

    @field_validator("embedder", mode="before")
    @classmethod
    def _embedder_by_name(cls, value):
        return {"model": value} if isinstance(value, str) else value  # `embedder: NAME`, the short form

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        return _check_store(value)

    @field_validator("extractor")
    @classmethod
    def _known_extractor(cls, value: str) -> str:
        return backend(value).name

    @model_validator(mode="after")
    def _consistent(self) -> MemoryConfig:
        extractor = backend(self.extractor)
        users = ["extractor"] if "model" in extractor.needs else []
        users += [name for name in ("query_parser", "consolidator") if getattr(self, name) == "model"]
        if users and self.model is None:
            raise ValueError(f"{'/'.join(users)} 'model' needs a `model:` section (base_url, model)")
        for key, what in extractor.needs.items():
            if not getattr(self, key):
                raise ValueError(f"extractor {extractor.name!r} needs {what}")
        return self

    def store_url(self) -> str:
        """The store's URL or path: the variable `store_env` names when set (ValueError when it is not in
        the environment), else `store`."""
        if self.store_env is None:
            return self.store
        value = os.environ.get(self.store_env)
        if not value:
            raise ValueError(
                f"store_env: the environment variable {self.store_env} (the store URL) is not set"
            )
        try:
            return _check_store(value)
        except ValueError as err:
            raise ValueError(f"store_env: {self.store_env}: {err}") from None

    def open_store(self):
        """The store of `store_url()`, with this config's options for its backend."""
        from dimmem.runtime.stores import is_postgres, open_store

        url = self.store_url()
        options = {"pool_min": self.pool.min, "pool_max": self.pool.max} if is_postgres(url) else {}
        return open_store(
            url, indexes=self.indexes, ann_min_records=self.retrieval.ann_min_records, **options
        )

    # --- the components (heavy imports stay inside: the CLI imports this module's users lazily) -----
    def client(self):
        """The model client of the 'model' components (one, shared), or None without a `model` section."""
        if self.model is None:
            return None
        from dimmem.llm import ModelClient

        return ModelClient(self.model)

    def build_embedder(self):
        from dimmem.runtime.embed import make_embedder

        return make_embedder(**self.embedder.model_dump())

    def build_extractor(self, client=None):
        """The extraction backend `extractor` names (dimmem.runtime.backends), started."""
        return backend(self.extractor).start(self, client)

    def build_query_parser(self, client=None):
        if self.query_parser == "model":
            from dimmem.runtime.query import ModelQueryParser

            return ModelQueryParser(client or self.client())
        from dimmem.runtime.query import parse_query_rules

        return parse_query_rules

    def build_consolidator(self, client=None):
        from dimmem.runtime.consolidate import ModelConsolidator, RuleConsolidator

        rules = RuleConsolidator(self.update.restate_similarity, self.update.restate_overlap)
        return ModelConsolidator(client or self.client(), rules) if self.consolidator == "model" else rules

    def build_token_counter(self):
        """Counts a window's rendered extract prompt, when `windows.max_tokens` sets a budget."""
        if self.windows.max_tokens is None:
            return None
        from dimmem.contract.formats import extract_format
        from dimmem.contract.prompts import extract_prompt_counter
        from dimmem.contract.tokens import load_tokenizer

        render = extract_format(self.extractor_format).messages
        return extract_prompt_counter(load_tokenizer(self.windows.tokenizer), render=render)


def load_memory_config(
    path: str | os.PathLike | None, overrides=(), *, store: str | None = None, **fields
) -> MemoryConfig:
    """A memory config from a YAML file, dotted overrides and fields, as every command reads it: a `store`
    the command names wins over the file's `store_env` (an eval's scratch store never lands in the
    production database the file points at)."""
    config = load_config(MemoryConfig, path, overrides, store=store, **fields)
    return config.model_copy(update={"store_env": None}) if store is not None else config
