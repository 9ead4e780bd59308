"""Versioned prompt templates, one YAML file per task and version (`<task>.v<N>.yaml`, Jinja2).

A label records the prompt it came from as `prompt_version` ("extract/v1") and `prompt_sha` (a hash of
the template text), so a changed template is never mistaken for the one a label was made with.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from itertools import groupby
from pathlib import Path

import jinja2
import yaml

PROMPT_DIR = Path(__file__).parent
_FILE = re.compile(r"^(?P<task>\w+)\.v(?P<version>\d+)\.yaml$")
_ENV = jinja2.Environment(
    undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False
)


@dataclass(frozen=True)
class PromptTemplate:
    task: str
    version: int
    system: str
    user: str

    @property
    def id(self) -> str:
        return f"{self.task}/v{self.version}"

    @property
    def sha(self) -> str:
        return hashlib.sha256(f"{self.system}\0{self.user}".encode()).hexdigest()[:12]

    def render(self, **variables) -> list[dict]:
        """System and user messages; the assistant's answer is what the model adds."""
        user = _compiled(self.user).render(**variables).strip()
        return [{"role": "system", "content": self.system.strip()}, {"role": "user", "content": user}]


@cache
def _compiled(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


def available() -> dict[str, list[int]]:
    versions: dict[str, list[int]] = {}
    for path in PROMPT_DIR.glob("*.yaml"):
        if match := _FILE.match(path.name):
            versions.setdefault(match["task"], []).append(int(match["version"]))
    return {task: sorted(v) for task, v in versions.items()}


@cache
def load_prompt(task: str, version: int | None = None) -> PromptTemplate:
    """A task's template (or the `repair` follow-up); the newest version unless one is named."""
    versions = available().get(task)
    if not versions:
        raise ValueError(f"no prompt for {task!r}; available: {sorted(available())}")
    if version is None and versions:
        version = versions[-1]
    path = PROMPT_DIR / f"{task}.v{version}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no prompt {task}/v{version}: {path} missing (available: {versions})")
    spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    if spec.get("task") != task or spec.get("version") != version:
        raise ValueError(f"{path}: declares task={spec.get('task')!r} version={spec.get('version')!r}")
    return PromptTemplate(task=task, version=version, system=spec["system"], user=spec["user"])


def human_date(iso: str | None) -> str:
    """'2023-05-08T13:56' -> '2023-05-08 (Monday) 13:56': the weekday helps resolve 'last Friday'."""
    if not iso:
        return "unknown date"
    moment = datetime.fromisoformat(iso)
    clock = f" {moment:%H:%M}" if "T" in iso else ""
    return f"{moment:%Y-%m-%d} ({moment:%A}){clock}"


def extract_messages(window, template: PromptTemplate | None = None) -> list[dict]:
    """The extract prompt of a window: context turns shown for reference, new turns marked, session dates
    given."""
    template = template or load_prompt("extract")
    local = iter(window.local_ids)
    rows = [(turn, next(local)) for turn in window.turns]

    def blocks(part):  # one block per session, dated by its first turn here
        groups = [list(group) for _, group in groupby(part, key=lambda row: row[0].session_id)]
        return [
            {
                "date": human_date(group[0][0].session_time),
                "turns": [{"local_id": lid, "speaker": t.speaker, "text": t.text} for t, lid in group],
            }
            for group in groups
        ]

    n_context = len(window.context)
    speakers = list(dict.fromkeys(t.speaker for t in window.turns))
    return template.render(
        conversation_id=window.conversation_id,
        speakers=speakers,
        context=blocks(rows[:n_context]),
        new=blocks(rows[n_context:]),
    )


def extract_prompt_counter(tokenizer, template: PromptTemplate | None = None, render=None):
    """count_tokens for windowing: tokens of a window's rendered extract prompt with the target tokenizer
    (a tokenizer, or its name or folder); `render(window)`: the messages of another extract format."""
    from dimmem.contract.tokens import count_prompt_tokens, load_tokenizer

    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    if render is None:
        template = template or load_prompt("extract")
        render = lambda window: extract_messages(window, template)  # noqa: E731
    return lambda window: count_prompt_tokens(tokenizer, render(window))


def parse_query_messages(
    question: str,
    reference_date: str | None,
    speakers: list[str] | None = None,
    template: PromptTemplate | None = None,
) -> list[dict]:
    template = template or load_prompt("parse_query")
    return template.render(
        question=question, reference_date=human_date(reference_date), speakers=speakers or []
    )


def consolidate_messages(
    new: dict,
    candidate: dict,
    new_time: str | None = None,
    candidate_time: str | None = None,
    template: PromptTemplate | None = None,
) -> list[dict]:
    template = template or load_prompt("consolidate")
    return template.render(
        new=json.dumps(new, ensure_ascii=False),
        candidate=json.dumps(candidate, ensure_ascii=False),
        new_time=new_time,
        candidate_time=candidate_time,
    )
