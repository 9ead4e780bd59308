"""The record time format, one definition: ISO 8601 date, partial date or interval, as a closed day span."""

from __future__ import annotations

import calendar
import re
from datetime import date

# ASCII digits only, and the whole string: `$` alone would let "2023-05-01\n" through, `\d` Arabic-Indic
# or full-width digits
_PARTIAL_DATE = re.compile(r"(\d{4})(?:-(\d{2})(?:-(\d{2}))?)?", re.ASCII)


def _bounds(part: str, value: str) -> tuple[date, date]:
    match = _PARTIAL_DATE.fullmatch(part)
    if not match:
        raise ValueError(f"{value!r} is not YYYY-MM-DD, YYYY-MM, YYYY or an interval start/end of those")
    year, month, day = (int(g) if g else None for g in match.groups())
    try:
        if day is not None:
            return date(year, month, day), date(year, month, day)
        if month is not None:
            return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])
        return date(year, 1, 1), date(year, 12, 31)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a calendar date ({exc})") from None


def parse_span(value: str) -> tuple[date, date]:
    """'2023-05' -> (2023-05-01, 2023-05-31); '2023-05-01/2023-06' -> (2023-05-01, 2023-06-30).

    Raises ValueError naming what is wrong."""
    parts = value.split("/")
    if len(parts) > 2:
        raise ValueError(f"{value!r} has more than one '/'")
    first, last = _bounds(parts[0], value), _bounds(parts[-1], value)
    if first[0] > last[0]:
        raise ValueError(f"interval {value!r} starts after it ends")
    return first[0], last[1]


def overlaps(a: tuple[date, date], b: tuple[date, date]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]
