"""Typed field access that reports where a malformed input is wrong."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dimmem.contract.conversation import DataFormatError

_MISSING = object()


class Record:
    """One record of an input file; `get` checks a field's type and names file, record and field on error."""

    def __init__(self, path: str | Path, record: str | int):
        self.path, self.record = path, record

    def error(self, field: str, problem: str) -> DataFormatError:
        return DataFormatError(self.path, self.record, field, problem)

    def get(
        self, obj: Any, key: str | int, types: type | tuple[type, ...], field: str, default: Any = _MISSING
    ) -> Any:
        try:
            value = obj[key]
        except (KeyError, IndexError, TypeError):
            if default is not _MISSING:
                return default
            raise self.error(field, "missing") from None
        if value is None and default is not _MISSING:
            return default
        wrong_type = not isinstance(value, types) or (
            isinstance(value, bool) and bool not in _as_tuple(types)
        )
        if wrong_type:  # bool is an int subclass; a `true` where a number belongs is still wrong
            names = "/".join(t.__name__ for t in _as_tuple(types))
            raise self.error(field, f"expected {names}, got {type(value).__name__}")
        return value

    def time(self, raw: Any, field: str, formats: tuple[str, ...]) -> str:
        """Parse a timestamp into ISO 8601 (minutes, or a bare date when no clock time is given)."""
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return (
                datetime.fromtimestamp(raw, tz=UTC).replace(tzinfo=None).isoformat(timespec="minutes")
            )  # epoch: UTC
        if isinstance(raw, str):
            text = raw.strip()
            for fmt in formats:
                try:
                    parsed = datetime.strptime(text, fmt)
                except ValueError:
                    continue
                has_clock = any(code in fmt for code in ("%H", "%I", "%M"))
                return parsed.isoformat(timespec="minutes") if has_clock else parsed.date().isoformat()
            try:
                parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                pass
            else:
                return (
                    parsed.isoformat(timespec="minutes")
                    if ("T" in text or " " in text)
                    else parsed.date().isoformat()
                )
        raise self.error(field, f"unparseable timestamp {raw!r}")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def read_json(path: str | Path) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, f"line {exc.lineno}", "<file>", f"invalid JSON: {exc.msg}") from None
