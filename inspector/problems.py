"""What a page says instead of a traceback: a status, a title and a sentence the reader can act on."""

from __future__ import annotations


class Problem(Exception):
    def __init__(self, status: int, title: str, message: str):
        self.status, self.title, self.message = status, title, message
        super().__init__(f"{title}: {message}")
