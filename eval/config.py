"""Evaluation runs as configs (`configs/eval/*.yaml`), loaded by the one config loader: every flag of
`dimmem eval ...` is a key here, so a run can live in a file and be overridden from the command line."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator

from dimmem.config import Section, WindowConfig
from dimmem.contract.formats import ExtractFormatName
from dimmem.llm import ModelConfig
from dimmem.runtime.backends import standalone
from eval.sources import SOURCES, given


class Thresholds(Section):
    """Similarity at which a record states a gold memory, per measure (eval/locomo_gold.py)."""

    cosine: float = Field(ge=-1, le=1)  # embedding cosine (all-MiniLM-L6-v2)
    token_f1: float = Field(ge=0, le=1)


class Sweep(Section):
    """Thresholds at which the report also gives fact F1, per measure: a lead that holds at one setting
    only shows."""

    cosine: list[float] = [0.55, 0.6, 0.65, 0.7, 0.75, 0.8]
    token_f1: list[float] = [0.2, 0.25, 0.3, 0.35, 0.4, 0.45]


class LocomoExtraction(Section):
    """The LoCoMo extraction benchmark: windows, gold and scoring (eval/extraction_locomo.py)."""

    input: str | None = None  # locomo10.json; null: the shared data's
    conversations: list[str] | None = None  # score only these (held out from training); null: all
    # the paper's 25/5; no LoCoMo window nears datagen's 4,096-token budget, so both cut the same windows
    windows: WindowConfig = WindowConfig(window=25, overlap=5)
    thresholds: Thresholds | None = None  # null: fitted on the other conversations of the input
    sweep: Sweep = Sweep()
    # a record dates an event when its time falls within this many days before the event's session
    event_days: int = Field(7, ge=0)
    bootstrap: int = Field(1000, ge=0)  # resamples of the sessions for the 95% intervals (0: none)
    tokenizer: str | None = None  # counts tokens per record; null: the Qwen3 tokenizer in the shared data
    sample: int = Field(20, ge=0)  # matched and unmatched records each in sample.md, the reading sample


class ExtractionRun(Section):
    """`dimmem eval extraction`: one extractor's answers scored against a datagen split's references, or
    against LoCoMo's own annotations (`benchmark: locomo`)."""

    benchmark: Literal["references", "locomo"] = "references"
    references: str | None = None  # a datagen output or dataset folder, DIR[:split] (default split: test)
    out: str
    model: ModelConfig | None = None  # an OpenAI-compatible endpoint serving the extractor
    hf_model: str | None = None  # a local Hugging Face model or export folder (transformers, unconstrained)
    predictions: str | None = (
        None  # stored answers, JSONL {window_id, output, finish_reason?, completion_tokens?}
    )
    # locomo: a runtime extraction backend that needs no model (dimmem.runtime.backends.standalone)
    extractor: str | None = None
    labels: str | None = None  # locomo: a data_gen labels.jsonl of the same windows (a teacher's answers)
    locomo: LocomoExtraction = LocomoExtraction()
    # what the model speaks (model, hf_model): this contract, or the DimMem authors' format, whose
    # answers are mapped onto the contract before scoring (dimmem.contract.formats)
    extractor_format: ExtractFormatName = "dimmem"
    max_tokens: int = Field(1024, ge=1)
    batch_size: int = Field(8, ge=1)  # hf_model generation batch
    limit: int | None = Field(None, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _references_given(cls, data):
        """Name what a references run lacks before anything else (an empty config asks for it first)."""
        references_run = isinstance(data, dict) and data.get("benchmark", "references") == "references"
        if references_run and not data.get("references"):
            raise ValueError("missing key 'references' (a datagen output, DIR[:split]; or benchmark: locomo)")
        return data

    @field_validator("extractor")
    @classmethod
    def _standalone_extractor(cls, value: str | None) -> str | None:
        if value is not None and value not in standalone():
            raise ValueError(
                f"extractor {value!r}: one of {', '.join(standalone())} (a model: give model or hf_model)"
            )
        return value

    @model_validator(mode="after")
    def _one_source(self) -> ExtractionRun:
        found = given(self)
        if len(found) != 1:
            raise ValueError(
                f"give exactly one answer source of {', '.join(s.key for s in SOURCES)} "
                f"(got {[s.key for s in found] or 'none'})"
            )
        (source,) = found
        if self.extractor_format != "dimmem" and not source.model:
            models = " or ".join(s.key for s in SOURCES if s.model)
            raise ValueError(
                f"extractor_format {self.extractor_format} is what a model speaks: give {models} "
                f"(stored {source.key} are contract answers)"
            )
        if self.benchmark == "references":
            if source.locomo_only:
                raise ValueError(f"{source.key} runs on LoCoMo windows only: set benchmark: locomo")
        elif self.references:
            raise ValueError("benchmark locomo scores against LoCoMo's annotations: drop references")
        elif self.limit is not None:
            raise ValueError(
                "benchmark locomo scores whole conversations: select them with locomo.conversations"
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
    full_context: bool = False  # the whole conversation in the answer prompt (the baseline to beat)
    runs: int = Field(1, ge=1)  # each question answered and judged this many times: mean ± std
    judge_max_tokens: int = Field(256, ge=1)  # room for a judge that reasons before its verdict


MemorySet = Literal[
    "turns", "records", "records_content_only", "records+consolidation", "records+oracle_consolidation"
]  # the toy benchmark's built-in memory sets (eval/retrieval_toy.py)


class ToyRetrieval(Section):
    """The toy-world retrieval benchmark (eval/retrieval_toy.py): its world, questions and memory sets."""

    # a world the demo's model never trained on (the demo's datagen world has seed 0), with longer
    # dialogues: more of each person's events compete for every question
    seed: int = 1000
    conversations: int = Field(12, ge=1)
    sessions: int = Field(8, ge=1)
    stories_per_session: int = Field(5, ge=1)
    questions_per_class: int = Field(4, ge=1)  # per dialogue
    assistant_chats: int = Field(8, ge=0)  # user-assistant chats for assistant recall (0: not measured)
    sets: list[MemorySet] = list(get_args(MemorySet))
    # name -> a local Hugging Face model or export folder whose extracted records are a memory set too
    extractors: dict[str, str] = {}
    windows: WindowConfig = WindowConfig(window=12, overlap=3, max_tokens=None)  # the demo's datagen windows
    max_new_tokens: int = Field(768, ge=1)
    batch_size: int = Field(8, ge=1)


class RetrievalRun(Section):
    """`dimmem eval retrieval`: LLM-free evidence recall per retrieval path."""

    benchmark: Literal["locomo", "toy"] = "locomo"
    input: str | None = None  # locomo10.json (LoCoMo only)
    memories: str = "turns"  # LoCoMo: turns | observations | a datagen labels.jsonl
    conversations: list[str] | None = None  # LoCoMo: only these (null: all)
    k: list[int] = [5, 10, 20]
    store: str = ":memory:"  # LoCoMo: where the memories are stored
    tokenizer: str | None = None  # counts context tokens; null: the Qwen3 tokenizer in the shared data
    toy: ToyRetrieval = ToyRetrieval()
    out: str | None = None  # the results as JSON (toy: extractor answers cached beside it, .cache.sqlite)

    @model_validator(mode="after")
    def _input_for_locomo(self) -> RetrievalRun:
        if self.benchmark == "locomo" and not self.input:
            raise ValueError("benchmark locomo needs input (locomo10.json)")
        return self


# command-line flag -> dotted config key, per subcommand
FLAGS = {
    "extraction": {
        "benchmark": "benchmark",
        "references": "references",
        "input": "locomo.input",
        "conversations": "locomo.conversations",
        "extractor": "extractor",
        "labels": "labels",
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
        "extractor_format": "extractor_format",
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
        "full_context": "full_context",
        "runs": "runs",
        "judge_max_tokens": "judge_max_tokens",
    },
    "retrieval": {
        "benchmark": "benchmark",
        "input": "input",
        "memories": "memories",
        "conversations": "conversations",
        "k": "k",
        "store": "store",
        "tokenizer": "tokenizer",
        "extractor": "toy.extractors",
        "out": "out",
    },
}
