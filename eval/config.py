"""Evaluation runs as configs (`configs/eval/*.yaml`), loaded by the one config loader: every flag of
`dimmem eval ...` is a key here, so a run can live in a file and be overridden from the command line."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dimmem.config import Section
from dimmem.llm import ModelConfig


class ExtractionRun(Section):
    """`dimmem eval extraction`: one extractor's answers scored against a datagen split."""

    references: str  # a datagen output or dataset folder, DIR[:split] (default split: test)
    out: str
    model: ModelConfig | None = None  # an OpenAI-compatible endpoint serving the extractor
    hf_model: str | None = None  # a local Hugging Face model or export folder (transformers, unconstrained)
    predictions: str | None = (
        None  # stored answers, JSONL {window_id, output, finish_reason?, completion_tokens?}
    )
    max_tokens: int = Field(1024, ge=1)
    batch_size: int = Field(8, ge=1)  # hf_model generation batch
    limit: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _one_source(self) -> ExtractionRun:
        given = [name for name in ("model", "hf_model", "predictions") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one answer source of model, hf_model, predictions (got {given or 'none'})"
            )
        return self


class QARun(Section):
    """`dimmem eval qa`: ingest, retrieve, answer, judge."""

    benchmark: Literal["locomo", "longmemeval"]
    input: str
    out: str
    memory_config: str = "configs/memory/default.yaml"  # its extractor ingests the conversations
    labels: str | None = None  # ingest a data_gen labels.jsonl instead of running the extractor
    answer: ModelConfig
    judge: ModelConfig
    k: int = Field(10, ge=1)
    categories: list[int] = [1, 2, 3, 4]  # LoCoMo categories (5: adversarial)
    limit: int | None = Field(None, ge=1)


class RetrievalRun(Section):
    """`dimmem eval retrieval`: LLM-free evidence recall per retrieval path."""

    benchmark: Literal["locomo"] = "locomo"
    input: str
    memories: str = "turns"  # turns | observations | a datagen labels.jsonl
    k: list[int] = [5, 10, 20]
    store: str = ":memory:"
    out: str | None = None


# command-line flag -> dotted config key, per subcommand
FLAGS = {
    "extraction": {
        "references": "references",
        "out": "out",
        "hf_model": "hf_model",
        "predictions": "predictions",
        "base_url": "model.base_url",
        "model": "model.model",
        "api_key_env": "model.api_key_env",
        "constrained": "model.structured_outputs",
        "concurrency": "model.concurrency",
        "max_tokens": "max_tokens",
        "batch_size": "batch_size",
        "limit": "limit",
    },
    "qa": {
        "benchmark": "benchmark",
        "input": "input",
        "out": "out",
        "memory_config": "memory_config",
        "labels": "labels",
        "answer_base_url": "answer.base_url",
        "answer_model": "answer.model",
        "answer_api_key_env": "answer.api_key_env",
        "judge_base_url": "judge.base_url",
        "judge_model": "judge.model",
        "judge_api_key_env": "judge.api_key_env",
        "k": "k",
        "categories": "categories",
        "limit": "limit",
    },
    "retrieval": {
        "benchmark": "benchmark",
        "input": "input",
        "memories": "memories",
        "k": "k",
        "store": "store",
        "out": "out",
    },
}
