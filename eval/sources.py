"""Where `dimmem eval extraction` gets the answers it scores: one table of answer sources.

Each source names the run-config key that selects it (a run gives exactly one), the `source` its
metrics.json records, whether this run generates its answers (and so is timed) or reads them back, and
whether it is a model, which may speak another extract format. `ExtractionRun` validates against the
table, the CLI's help reads it, and `answers` fetches through it for the references benchmark and
LoCoMo's alike. The model-free sources are the runtime's own backends (dimmem.runtime.backends), started
from a memory config as the runtime starts them. A new source is one fetch function and one row here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dimmem.runtime.backends import help_lines, standalone

if TYPE_CHECKING:
    from dimmem.cache import ResponseCache
    from dimmem.contract.windows import Window
    from eval.extraction import Prediction, Reference

Fetch = Callable[[Any, "list[Reference]", "ResponseCache"], "dict[str, Prediction]"]  # (ExtractionRun, ...)


@dataclass(frozen=True)
class AnswerSource:
    key: str  # the ExtractionRun key that selects it
    flag: str  # its `dimmem eval extraction` flag
    name: str  # the run's `source` in metrics.json
    about: str
    fetch: Fetch
    generates: bool = False  # this run generates the answers (its speed is measured), not reads them
    model: bool = False  # a model: it may speak another extract format (extractor_format)
    locomo_only: bool = False  # answers LoCoMo's windows only (it needs each window's turns)
    choices: tuple[str, ...] | None = None  # the names it takes, where it is one of a list

    @property
    def help(self) -> str:
        where = "locomo: " if self.locomo_only else ""
        return where + self.about + (f"; {help_lines(self.choices)}" if self.choices else "")

    def label(self, cfg) -> str:
        """What answered, as the run records it (`model` in metrics.json)."""
        return cfg.model.model if self.key == "model" else getattr(cfg, self.key)


def _endpoint(cfg, refs, cache):
    from dimmem.contract.formats import extract_format
    from dimmem.llm import ModelClient
    from eval.extraction import predict_endpoint

    # another server answering to the same model name is another model: the endpoint is in the key
    client = ModelClient(cfg.model, cache=cache, key_extra={"endpoint": cfg.model.base_url})
    return predict_endpoint(refs, client, cfg.max_tokens, extract_format(cfg.extractor_format))


def _transformers(cfg, refs, cache):
    from eval.extraction import predict_hf

    return predict_hf(refs, cfg.hf_model, cache, cfg.max_tokens, cfg.batch_size)


def _stored(cfg, refs, cache):
    from eval.extraction import read_predictions

    return read_predictions(cfg.predictions)


def _backend(cfg, refs, cache):
    from dimmem.runtime.config import MemoryConfig

    return _runtime_answers(MemoryConfig(extractor=cfg.extractor), refs)


def _labels(cfg, refs, cache):
    from dimmem.runtime.config import MemoryConfig

    windows = [ref.window for ref in refs]
    check_labels(cfg.labels, windows)
    return _runtime_answers(MemoryConfig(extractor="replay", labels=cfg.labels), refs)


def _runtime_answers(memory, refs) -> dict[str, Prediction]:
    """A runtime backend's answers as predictions: whole as given (finish "stop"), or the reason there
    is none."""
    from eval.extraction import Prediction

    answers = memory.build_extractor()([ref.window for ref in refs])
    return {
        w: Prediction(w, "", error=a) if isinstance(a, str) else Prediction(w, json.dumps(a), "stop")
        for w, a in answers.items()
    }


SOURCES = (
    AnswerSource("model", "--base-url", "endpoint", "an OpenAI-compatible endpoint serving the extractor",
                 _endpoint, generates=True, model=True),
    AnswerSource("hf_model", "--hf-model", "hf", "a local Hugging Face model or export folder (transformers)",
                 _transformers, generates=True, model=True),
    AnswerSource("predictions", "--predictions", "predictions",
                 "stored answers, JSONL {window_id, output, finish_reason?, completion_tokens?}", _stored),
    AnswerSource("extractor", "--extractor", "rule", "a runtime backend that needs no model", _backend,
                 locomo_only=True, choices=tuple(standalone())),
    AnswerSource("labels", "--labels", "labels",
                 "a data_gen labels.jsonl of the same windows (a teacher's answers)", _labels,
                 locomo_only=True),
)  # fmt: skip


def given(cfg) -> list[AnswerSource]:
    """The sources an ExtractionRun (eval.config) gives; a valid run gives one."""
    return [s for s in SOURCES if getattr(cfg, s.key) is not None]


def answers(cfg, refs: list[Reference], cache: ResponseCache) -> tuple[dict[str, Prediction], AnswerSource]:
    """(predictions, source) from the run's one answer source; a model speaking another extract format
    is asked in it and its answers mapped onto the contract."""
    from dimmem.contract.formats import extract_format
    from eval.extraction import in_contract, in_format

    (source,) = given(cfg)
    fmt = extract_format(cfg.extractor_format)
    other_format = source.model and fmt.name != "dimmem"
    if other_format:
        refs = [in_format(ref, fmt) for ref in refs]
    found = source.fetch(cfg, refs, cache)
    if other_format:
        windows = {ref.window_id: ref.window for ref in refs}
        found = {wid: in_contract(p, windows[wid], fmt) for wid, p in found.items()}
    return found, source


def check_labels(path: str | Path, windows: list[Window]) -> None:
    """Refuse a labels file windowed differently from this benchmark: its answers would be scored against
    other turns. Each label row names the global turns it cites; they must be new turns of our window."""
    new = {w.id: {t.id for t in w.new} for w in windows}
    conversations = {w.conversation_id for w in windows}
    found = 0
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {number}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict) or "window_id" not in row:
                raise ValueError(f"{path}: line {number}: not a data_gen label row (no window_id)")
            if row.get("task") != "extract" or row.get("conversation_id") not in conversations:
                continue
            turns = {t for m in row.get("memories") or [] for t in m.get("source_turns") or []}
            outside = sorted(turns - new.get(row["window_id"], set()))
            if row["window_id"] not in new or outside:
                raise ValueError(
                    f"{path}: line {number}: window {row['window_id']} was cut differently from this "
                    f"benchmark's windows (its records cite {outside}); "
                    "score labels made with the same locomo.windows settings"
                )
            found += 1
    if not found:
        raise ValueError(f"{path}: no extract label for any window of {sorted(conversations)}")
