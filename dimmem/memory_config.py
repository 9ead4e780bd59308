"""The runtime's configuration: a YAML file (`configs/memory/*.yaml`) that builds a `Memory`.

One `model` section names the endpoint that serves the DimMem tasks (the compact extractor answers all
three); `extractor`, `query_parser` and `consolidator` each choose it or their fallback. The API key is
read from the environment variable `api_key_env` names, never from the file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Section):
    base_url: str
    model: str
    api_key_env: str | None = None
    constrained: bool = True  # strict JSON Schema as structured output
    max_tokens: int = 1024
    max_tokens_cap: int = 4096
    timeout: float = 120.0
    max_retries: int = 4
    concurrency: int = 8  # windows of one conversation in flight


class WindowConfig(_Section):
    window: int = 20
    overlap: int = 4
    max_tokens: int | None = None  # budget of the rendered extract prompt; needs `tokenizer`
    tokenizer: str | None = None


class RetrievalConfig(_Section):
    depth: int = 50  # candidates each path contributes to fusion
    weights: dict[str, float] | None = None  # weighted RRF; None: plain RRF
    ann_min_records: int = 200_000  # a user's dense search switches from exact to HNSW here


class UpdateConfig(_Section):
    similarity_threshold: float = 0.6
    max_candidates: int = 200


class MemoryConfig(_Section):
    store: str = "memories.sqlite"
    embedder: str | None = None  # all-MiniLM-L6-v2 from the offline package by default
    model: ModelConfig | None = None
    extractor: Literal["model", "replay", "turns"] = "turns"
    labels: str | None = None  # labels.jsonl for the replay extractor
    query_parser: Literal["model", "rules"] = "rules"
    consolidator: Literal["model", "rules"] = "rules"
    windows: WindowConfig = WindowConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    update: UpdateConfig = UpdateConfig()

    def build(self):
        from dimmem.consolidate import ModelConsolidator
        from dimmem.embed import Embedder
        from dimmem.extractors import EndpointExtractor, ReplayExtractor, TurnExtractor
        from dimmem.llm import ChatModel
        from dimmem.memory import Memory
        from dimmem.query import ModelQueryParser

        model = None
        if self.model is not None:
            m = self.model
            model = ChatModel(m.base_url, m.model, api_key_env=m.api_key_env, constrained=m.constrained, max_tokens=m.max_tokens,
                              max_tokens_cap=m.max_tokens_cap, timeout=m.timeout, max_retries=m.max_retries)
        extractor = {"model": lambda: EndpointExtractor(model, self.model.concurrency),
                     "replay": lambda: ReplayExtractor(self.labels), "turns": TurnExtractor}[self.extractor]()
        count_tokens = None
        if self.windows.max_tokens is not None:
            from dimmem.prompts import extract_prompt_counter
            from dimmem.tokens import load_tokenizer

            count_tokens = extract_prompt_counter(load_tokenizer(self.windows.tokenizer))
        return Memory(self.store, embedder=Embedder(self.embedder), extractor=extractor,
                      query_parser=ModelQueryParser(model) if self.query_parser == "model" else None,
                      consolidator=ModelConsolidator(model) if self.consolidator == "model" else None,
                      window=self.windows.window, overlap=self.windows.overlap, count_tokens=count_tokens,
                      max_tokens=self.windows.max_tokens, similarity_threshold=self.update.similarity_threshold,
                      max_candidates=self.update.max_candidates, depth=self.retrieval.depth,
                      weights=self.retrieval.weights, ann_min_records=self.retrieval.ann_min_records)


def load_memory_config(path: str | Path, **overrides) -> MemoryConfig:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    raw.update({k: v for k, v in overrides.items() if v is not None})
    try:
        config = MemoryConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid memory config:\n{exc}") from None
    uses_model = "model" in (config.extractor, config.query_parser, config.consolidator)
    if uses_model and config.model is None:
        raise ValueError(f"{path}: extractor/query_parser/consolidator 'model' needs a `model:` section (base_url, model)")
    if config.extractor == "replay" and not config.labels:
        raise ValueError(f"{path}: extractor 'replay' needs `labels:` (a data_gen labels.jsonl)")
    if config.windows.max_tokens is not None and not config.windows.tokenizer:
        raise ValueError(f"{path}: windows.max_tokens needs windows.tokenizer to count prompt tokens")
    return config
