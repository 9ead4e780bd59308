"""Extract formats: how a window is put to an extractor and how its answer becomes a contract answer.

`dimmem` is the contract itself (`prompts/extract.v*.yaml`, the window's own schema). The others speak a
published extractor's own format at the edge (`paper_format`), so a model trained on it is served and
scored by config alone (`extractor_format:` in the memory and eval configs) while everything behind the
adapter sees contract records.
"""

from __future__ import annotations

import json
from typing import Literal, Protocol

from dimmem.contract.paper_format import FORMATS as PAPER_FORMATS
from dimmem.contract.prompts import extract_messages
from dimmem.contract.records import response_format
from dimmem.contract.windows import Window

ExtractFormatName = Literal["dimmem", "dimmem-paper", "dimmem-paper-longmemeval"]


class ExtractFormat(Protocol):
    name: str

    def messages(self, window: Window) -> list[dict]:
        """The prompt of one window."""

    def citable(self, window: Window) -> bool:
        """Whether the window shows the model a new message to extract from (else: no request, no
        memory)."""

    def response_format(self, window: Window) -> dict:
        """The OpenAI `response_format` that constrains an answer to this window."""

    def decode(self, text: str) -> dict:
        """The answer's JSON object (json.JSONDecodeError when there is none)."""

    def to_contract(self, answer: dict | str, window: Window) -> dict | str:
        """The answer as a contract extract answer, for the contract's validator."""


class ContractFormat:
    name = "dimmem"

    def messages(self, window: Window) -> list[dict]:
        return extract_messages(window)

    def citable(self, window: Window) -> bool:
        return bool(window.new)

    def response_format(self, window: Window) -> dict:
        return response_format("extract", window.scope.citable())

    def decode(self, text: str) -> dict:
        return json.loads(text)

    def to_contract(self, answer: dict | str, window: Window) -> dict | str:
        return answer


EXTRACT_FORMATS: dict[str, ExtractFormat] = {"dimmem": ContractFormat(), **PAPER_FORMATS}
assert set(EXTRACT_FORMATS) == set(ExtractFormatName.__args__), "ExtractFormatName lists every format"


def extract_format(name: str) -> ExtractFormat:
    try:
        return EXTRACT_FORMATS[name]
    except KeyError:
        raise ValueError(
            f"unknown extract format {name!r}; expected one of {sorted(EXTRACT_FORMATS)}"
        ) from None
