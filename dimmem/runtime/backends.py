"""The memory runtime's extraction backends, one table: each registers its name, a line saying what it is,
what it needs from the memory config and how it starts. The memory config (`extractor:`), `dimmem memory
add|extract --extractor`, both servers' `--student`, and `dimmem eval extraction --extractor` read this
table; a new backend is one start function here and its `register` line.

A backend starts from the whole memory config (its own section, `student:` say, lives there) and the model
client the 'model' components share, and returns an `Extractor` (dimmem.runtime.extractors): windows in,
one answer per window out. Heavy imports wait inside each start: naming a backend loads nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Backend:
    name: str
    about: str  # one line, for --help and errors
    start: Callable[[Any, Any], Any]  # (memory config, shared model client or None) -> Extractor
    needs: dict[str, str] = field(default_factory=dict)  # memory-config key -> what it is, said when unset
    settings: tuple[str, ...] = ()  # dotted memory-config settings it brings (the windows it trained on)
    model_free: bool = False  # its answers are whole as given: no decoding, nothing cut at a budget


BACKENDS: dict[str, Backend] = {}


def register(name: str, about: str, *, needs=None, settings=(), model_free=False):
    def add(start):
        if name in BACKENDS:
            raise ValueError(f"extraction backend {name!r} is registered twice")
        BACKENDS[name] = Backend(name, about, start, dict(needs or {}), tuple(settings), model_free)
        return start

    return add


def backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown extractor {name!r}: one of {', '.join(BACKENDS)}")
    return BACKENDS[name]


def chosen(name: str) -> list[str]:
    """The memory-config settings that make `name` the extractor (`--extractor`, `--student`); settings
    given after them win."""
    return [f"extractor={name}", *backend(name).settings]


def standalone() -> list[str]:
    """The backends that answer with no model and nothing to configure (what eval runs by name alone)."""
    return [b.name for b in BACKENDS.values() if b.model_free and not b.needs]


def help_lines(names=None) -> str:
    return "; ".join(f"{b.name}: {b.about}" for b in BACKENDS.values() if names is None or b.name in names)


@register(
    "turns",
    "each new turn of a person one episodic record dated by its session (no model; the raw-turns baseline)",
    model_free=True,
)
def _turns(config, client):
    from dimmem.runtime.extractors import TurnExtractor

    return TurnExtractor()


@register(
    "replay",
    "the answers a data_gen labels.jsonl stores, looked up by window id",
    needs={"labels": "`labels:` (a data_gen labels.jsonl)"},
    model_free=True,
)
def _replay(config, client):
    from dimmem.runtime.extractors import ReplayExtractor

    return ReplayExtractor(config.labels)


@register(
    "model",
    "a model behind an OpenAI-compatible endpoint, speaking extractor_format",
    needs={"model": "a `model:` section (base_url, model)"},
)
def _endpoint(config, client):
    from dimmem.contract.formats import extract_format
    from dimmem.runtime.extractors import EndpointExtractor

    fmt = extract_format(config.extractor_format)
    return EndpointExtractor(client or config.client(), config.model.concurrency, fmt)


@register(
    "student",
    "the shipped student (dimmem/students/) under llama.cpp on this machine, built on first use",
    settings=("windows.window=25", "windows.overlap=5"),  # the windows it was trained on
)
def _student(config, client):
    from dimmem.runtime.student import StudentExtractor

    return StudentExtractor(config.student)
