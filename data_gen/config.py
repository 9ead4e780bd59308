"""The datagen run configuration: a YAML file (`configs/datagen/*.yaml`) with command-line overrides.

The API key is never part of it: the teacher reads it from the environment variable `api_key_env` names.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceConfig(_Section):
    format: str  # a dimmem loader format, "hf_messages" (a saved or Hub dataset in messages form) or "toy"
    input: str | None = None
    split: str = "train"  # for hf_messages
    # toy world
    seed: int = 0
    conversations: int = 40
    sessions: int = 4
    stories_per_session: int = 4


class WindowConfig(_Section):
    window: int = 25
    overlap: int = 5
    max_tokens: int | None = 4096
    tokenizer: str = "Qwen/Qwen3-4B"


class TeacherConfig(_Section):
    kind: Literal["openai", "oracle"] = "openai"  # oracle: ground truth of the toy world, no LLM
    base_url: str | None = None  # None: the OpenAI API
    model: str = "gpt-4.1"
    api_key_env: str = "OPENAI_API_KEY"
    structured_outputs: bool = True  # strict JSON Schema; False: plain JSON mode for endpoints without it
    temperature: float = 0.0
    max_tokens: int = 2048
    max_tokens_cap: int = 8192  # truncated answers are retried with double the budget up to this cap
    timeout: float = 120.0
    extra_body: dict = {}  # passed through, e.g. {"chat_template_kwargs": {"enable_thinking": false}}
    concurrency: int = 16
    rpm: float | None = None  # requests per minute
    tpm: float | None = None  # tokens per minute (prompt + max_tokens, as providers count them)
    max_retries: int = 6
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    repair_rounds: int = 1


class TaskConfig(_Section):
    extract: bool = True
    parse_query: bool = True
    consolidate: bool = True
    consolidate_candidates: int = 2  # earlier records each new record is paired with, at most


class SplitConfig(_Section):
    validation: float = 0.1
    test: float = 0.1
    seed: int = 0


class Price(_Section):
    input: float  # USD per million tokens
    output: float


class DatagenConfig(_Section):
    source: SourceConfig
    out: str
    windows: WindowConfig = WindowConfig()
    teacher: TeacherConfig = TeacherConfig()
    tasks: TaskConfig = TaskConfig()
    split: SplitConfig = SplitConfig()
    prices: dict[str, Price] = {}
    limit: int | None = None  # at most this many windows
    batch: bool = False
    batch_poll_seconds: float = 30.0
    batch_price_factor: float = 0.5  # Batch API requests cost this fraction of the listed price
    retry_quarantined: bool = False
    license: str | None = None  # of the source data, for the dataset card


# command-line flag -> dotted config field
OVERRIDES = {
    "format": "source.format", "input": "source.input", "out": "out", "base_url": "teacher.base_url",
    "model": "teacher.model", "concurrency": "teacher.concurrency", "window": "windows.window",
    "overlap": "windows.overlap", "max_tokens": "windows.max_tokens", "tokenizer": "windows.tokenizer",
    "limit": "limit", "batch": "batch", "retry_quarantined": "retry_quarantined", "teacher": "teacher.kind",
}


def load_config(path: str | Path, overrides: dict | None = None) -> DatagenConfig:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        node = raw
        *parents, leaf = OVERRIDES[flag].split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return DatagenConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"{path}: invalid datagen config:\n{exc}") from None
