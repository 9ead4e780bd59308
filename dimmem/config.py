"""One way to configure every stage (training aside, which keeps TRL's own `TrlParser`): a YAML file,
overridden by dotted `key=value` pairs or by command-line flags, validated into a pydantic model whose
sections refuse unknown keys. Every mistake is one line that names the file and the key:

    cfg = load_config(DatagenConfig, "configs/datagen/toy.yaml", {"teacher.model": "gpt-4.1-mini"})
    cfg = load_config(DatagenConfig, "configs/datagen/toy.yaml", ["limit=20", "teacher.rpm=100"])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


class Section(BaseModel):
    """A block of settings: unknown keys are refused, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid")


class WindowConfig(Section):
    """Overlap-aware windowing (dimmem.contract.windows): W turns, O of them repeated as context, and
    an optional budget for the rendered extract prompt, counted with `tokenizer`."""

    window: int = Field(20, ge=1, description="turns per window (W)")
    overlap: int = Field(4, ge=0, description="context turns repeated from the previous window (O)")
    max_tokens: int | None = Field(
        None, ge=1, description="budget of the rendered extract prompt; null: none"
    )
    tokenizer: str | None = Field(None, description="tokenizer name or folder the budget is counted with")

    @model_validator(mode="after")
    def _consistent(self) -> WindowConfig:
        if self.overlap >= self.window:
            raise ValueError(f"overlap ({self.overlap}) must be smaller than window ({self.window})")
        if self.max_tokens is not None and not self.tokenizer:
            raise ValueError("max_tokens needs a tokenizer to count prompt tokens")
        return self


M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> dict:
    """A YAML file of settings as a dict (an empty file is {}); a clear error otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got a YAML {type(raw).__name__}")
    return raw


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """`["teacher.rpm=100", "tasks.consolidate=false"]` -> {dotted key: YAML-parsed value}."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {pair!r}: expected KEY=VALUE, e.g. teacher.model=gpt-4.1-mini")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def add_set_argument(parser, example: str) -> None:
    """The `--set KEY=VALUE` flag every config-driven command takes (into `args.overrides`)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config key (dotted, YAML value), e.g. --set {example}; repeatable",
    )


def apply_overrides(raw: dict, overrides: Mapping[str, Any], source: str) -> dict:
    """Set each dotted key in a copy of `raw` (a None value sets null: `--set key=null` clears a key)."""
    raw = dict(raw)
    for dotted, value in overrides.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for i, key in enumerate(parents):
            child = node.get(key)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise ConfigError(
                    f"{source}: cannot set {dotted}: {'.'.join(parents[: i + 1])} is not a section"
                )
            node[key] = child = dict(child)
            node = child
        node[leaf] = value
    return raw


def with_section_defaults(model: type[BaseModel], raw: dict) -> dict:
    """`raw` with each section it gives in part completed from that field's own default: a section whose
    default sets keys (a benchmark's `windows: {window: 25, overlap: 5}`) keeps them when the config or
    `--set` names only another key of it, instead of falling back to the section class's defaults."""
    out = dict(raw)
    for name, field in model.model_fields.items():
        value, default = out.get(name), field.default
        if isinstance(value, dict) and isinstance(default, BaseModel):
            out[name] = _merged(
                default.model_dump(exclude_unset=True), with_section_defaults(type(default), value)
            )
    return out


def _merged(base: dict, given: dict) -> dict:
    """`given` over `base`, section by section."""
    out = dict(base)
    for key, value in given.items():
        out[key] = (
            _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def validate_config(model: type[M], raw: dict, source: str) -> M:
    """`raw` as `model` (sections given in part completed from their defaults), or ConfigError with one
    line per problem, each naming its key."""
    try:
        return model.model_validate(with_section_defaults(model, raw))
    except ValidationError as exc:
        raise ConfigError(f"{source}: " + "; ".join(_problem(e) for e in exc.errors())) from None


def load_config(
    model: type[M],
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | Iterable[str] = (),
    flags: Mapping[str, Any] | None = None,
    **fields: Any,
) -> M:
    """YAML file (optional) -> dotted `overrides` ("key=value" strings or a mapping, `--set`) -> `flags`
    (dotted key -> value) and keyword `fields` given on the command line, where None means "not given"
    so an override stands -> validated `model`."""
    raw = read_yaml(path) if path is not None else {}
    source = str(path) if path is not None else model.__name__
    if not isinstance(overrides, Mapping):
        overrides = parse_overrides(overrides)
    given = {key: value for key, value in {**(flags or {}), **fields}.items() if value is not None}
    raw = apply_overrides(raw, {**overrides, **given}, source)
    return validate_config(model, raw, source)


def _problem(error: dict) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "value_error":  # a model's own check: its message says it all
        message = error["msg"].removeprefix("Value error, ")
        return f"{key}: {message}" if key else message
    key = key or "<top level>"
    if error["type"] == "extra_forbidden":
        return f"unknown key {key!r}"
    if error["type"] == "missing":
        return f"missing key {key!r}"
    value = error.get("input")
    shown = (
        f" (got {value!r})" if isinstance(value, (str, int, float, bool)) and len(repr(value)) < 60 else ""
    )
    return f"{key}: {error['msg']}{shown}"
