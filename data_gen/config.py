"""The datagen run configuration: `configs/datagen/*.yaml`, overridden by flags or `--set key=value`,
loaded by the one config loader (`dimmem.config`). The teacher is a `dimmem.llm.ModelConfig` with the
teacher's own defaults; its API key is read from the environment variable `api_key_env` names."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dimmem.config import Section, WindowConfig
from dimmem.llm import ModelConfig, Price


class SourceConfig(Section):
    format: str  # a dimmem loader format, "hf_messages" (a saved or Hub dataset in messages form) or "toy"
    input: str | None = None
    split: str = "train"  # for hf_messages
    include: list[str] | None = None  # only these conversations (null: all)
    # conversations held out (a benchmark's): never windowed or labeled; the report checks the rest
    # against them (`check-overlap`)
    exclude: list[str] = []
    # toy world
    seed: int = 0
    conversations: int = Field(40, ge=1)
    sessions: int = Field(4, ge=1)
    stories_per_session: int = Field(4, ge=1)


TeacherKind = Literal["openai", "oracle", "annotations"]
TEACHER_KINDS: tuple[str, ...] = TeacherKind.__args__


class TeacherConfig(ModelConfig):
    # oracle: the toy world's ground truth; annotations: the corpus's own annotations (LoCoMo's
    # observations and events, data_gen/annotations.py); neither calls a model
    kind: TeacherKind = "openai"
    model: str = "gpt-4.1"
    api_key_env: str | None = "OPENAI_API_KEY"
    max_tokens: int = Field(2048, ge=1)
    max_tokens_cap: int = Field(8192, ge=1)
    max_retries: int = Field(6, ge=0)
    concurrency: int = Field(16, ge=1)
    repair_rounds: int = Field(
        1, ge=0
    )  # invalid answers are sent back with the validator's report this often


class TaskConfig(Section):
    extract: bool = True
    parse_query: bool = True
    consolidate: bool = True
    consolidate_candidates: int = Field(2, ge=1)  # earlier records each new record is paired with, at most


class AugmentConfig(Section):
    """Speaker-renamed copies of each conversation (data_gen/augment.py), split with their original."""

    renamed_copies: int = Field(0, ge=0)
    lookalike_share: float = Field(0.5, ge=0, le=1)  # of copies whose two names differ by one vowel
    seed: int = 0


class SplitConfig(Section):
    validation: float = Field(0.1, ge=0, lt=1)
    test: float = Field(0.1, ge=0, lt=1)
    seed: int = 0


class DatagenConfig(Section):
    source: SourceConfig
    out: str
    windows: WindowConfig = WindowConfig(window=25, overlap=5, max_tokens=4096, tokenizer="Qwen/Qwen3-4B")
    teacher: TeacherConfig = TeacherConfig()
    tasks: TaskConfig = TaskConfig()
    augment: AugmentConfig = AugmentConfig()
    split: SplitConfig = SplitConfig()
    prices: dict[str, Price] = {}  # model name -> USD per million tokens
    limit: int | None = Field(None, ge=1)  # at most this many jobs per task (smoke runs)
    batch: bool = False  # the OpenAI Batch API instead of online requests
    batch_poll_seconds: float = Field(30.0, gt=0)
    batch_price_factor: float = Field(0.5, gt=0)  # Batch API requests cost this fraction of the listed price
    retry_quarantined: bool = False
    license: str | None = None  # of the source data, for the dataset card


# command-line flag -> dotted config key
FLAGS = {
    "format": "source.format",
    "input": "source.input",
    "out": "out",
    "base_url": "teacher.base_url",
    "model": "teacher.model",
    "concurrency": "teacher.concurrency",
    "window": "windows.window",
    "overlap": "windows.overlap",
    "max_tokens": "windows.max_tokens",
    "tokenizer": "windows.tokenizer",
    "limit": "limit",
    "batch": "batch",
    "retry_quarantined": "retry_quarantined",
    "teacher": "teacher.kind",
}
