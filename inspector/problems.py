"""What a page says instead of a traceback: a status, a title and a sentence the reader can act on."""

from __future__ import annotations

import json
from pathlib import Path


class Problem(Exception):
    def __init__(self, status: int, title: str, message: str):
        self.status, self.title, self.message = status, title, message
        super().__init__(f"{title}: {message}")


def read_json(path: Path):
    """A JSON file's content; a ValueError naming the file and the line where it is not JSON."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
