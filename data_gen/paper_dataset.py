"""The DimMem authors' SFT rows in and out (`dimmem datagen import` / `dimmem datagen export`).

Their rows are `messages` [system: instructions, user: the window's lines, assistant: their answer] and
`metadata` {conv_name, window, n_memories} (layout and mapping: `dimmem.contract.paper_format`). Import
reads a Hub id, a local folder laid out as the Hub's, or JSON/JSONL files with `datasets`, rebuilds each
window from its lines, maps every memory onto the contract and runs the contract's validator on it; the
outputs are the ones `dimmem datagen` writes, so `dimmem train` runs on them unchanged. A row that
cannot be read or whose answer breaks a rule is quarantined with its reason, never dropped.

Splits go by template conversation: `Amber-conv41_v8` (variant 8 generated from LoCoMo's conv-41) and
every other variant of conv-41 land on one side, so no template leaks across train/validation/test.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from data_gen.config import SplitConfig
from data_gen.dataset import build_dataset, dataset_card, quarantine_reasons, write_outputs
from data_gen.jobs import Job
from data_gen.jobs_index import JOBS
from data_gen.labeler import Outcome
from dimmem.contract.conversation import Turn
from dimmem.contract.paper_format import (
    FORMATS,
    LayoutError,
    PaperFormat,
    read_lines,
    sessions,
    stated_context,
)
from dimmem.contract.prompts import extract_messages, load_prompt
from dimmem.contract.validate import validate
from dimmem.contract.windows import Window, job_windows
from dimmem.progress import progress

_VARIANT = re.compile(r"_v\d+$")
_LOCOMO_TEMPLATE = re.compile(r"conv-?(\d+)", re.IGNORECASE)
CONTAMINATION = (
    "Rows whose `conv_name` names a LoCoMo conversation (`<Name>-conv41_v8`) were generated from that "
    "LoCoMo conversation as a template: new names, topic and dates, the same message count, order and "
    "time gaps. A model trained on them has seen LoCoMo's structure: run `dimmem datagen check-overlap` "
    "before evaluating it on LoCoMo, and hold the templates of the evaluation conversations out."
)


def template_of(conv_name: str) -> str:
    """The conversation a row's variant was generated from: `Amber-conv41_v8` -> `conv-41`; a name
    without a LoCoMo template is its own template (its `_vN` suffix dropped)."""
    base = _VARIANT.sub("", conv_name)
    match = _LOCOMO_TEMPLATE.search(base)
    return f"conv-{int(match[1])}" if match else base


def load_rows(source: str) -> tuple[list[tuple[str, dict]], str | None]:
    """(`split[i]`, row) of every split, and the license the dataset states. `source`: a Hub dataset id,
    a local folder laid out as the Hub's (data files, or a `save_to_disk` folder), or a JSON/JSONL file."""
    import datasets
    from datasets import DatasetDict, load_dataset, load_from_disk

    datasets.disable_progress_bars()  # this command's own bar counts the rows
    path = Path(source)
    try:
        if (path / "dataset_dict.json").is_file() or (path / "dataset_info.json").is_file():
            data = load_from_disk(source)
        elif path.is_file():
            data = load_dataset("json", data_files=str(path))
        else:
            data = load_dataset(source)
    except Exception as exc:  # the datasets library's many ways to fail: one line that says which
        raise ValueError(f"{source}: not readable as a dataset ({type(exc).__name__}: {exc})") from None
    splits = data if isinstance(data, DatasetDict) else {"train": data}
    license_ = next((ds.info.license for ds in splits.values() if ds.info.license), None)
    rows = [(f"{name}[{i}]", row) for name, ds in splits.items() for i, row in enumerate(ds)]
    return rows, license_


@dataclass
class Read:
    """One row as far as it could be read: its window and answer, or the problem."""

    where: str
    conv_name: str
    index: int
    row: dict
    lines: list[Turn] | None = None
    window: Window | None = None
    system: str = ""
    answer: str | None = None
    problem: str | None = None


def _read(where: str, row: dict, seen: Counter) -> Read:
    """One row; without `metadata.window`, its place among the rows of its conversation so far."""
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    conv_name = str(metadata.get("conv_name") or where)
    index = metadata.get("window")
    numbered = isinstance(index, int) and not isinstance(index, bool)
    read = Read(where, conv_name, index if numbered else seen[conv_name], row)
    seen[conv_name] += 1
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        read.problem = "no `messages`"
        return read
    if bad := [i for i, m in enumerate(messages) if not _message(m)]:
        read.problem = f"messages[{bad[0]}] is not a {{role, content}} pair of strings"
        return read
    roles = Counter(m["role"] for m in messages)
    by_role = {m["role"]: m["content"] for m in messages}
    read.system = by_role.get("system", "")
    if roles["user"] != 1:
        read.problem = f"{roles['user']} user messages, expected one (the window's lines)"
    elif roles["assistant"] != 1:
        read.problem = f"{roles['assistant']} assistant messages, expected one (the answer)"
    else:
        read.answer = by_role["assistant"]
        try:
            read.lines = read_lines(by_role["user"])
        except LayoutError as exc:
            read.problem = f"user message: {exc}"
    return read


def _message(m) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)


def _variant(reads: list[Read], wanted: str) -> PaperFormat:
    if wanted != "auto":
        return FORMATS[wanted]
    everyone = {t.speaker for r in reads if r.lines for t in r.lines}
    return FORMATS["dimmem-paper-longmemeval" if everyone <= {"User"} else "dimmem-paper"]


def _context_size(read: Read, previous: Read | None) -> int | str:
    """How many leading lines are context: as the system message states, else the lines this window
    repeats from the end of the previous one, else none for a conversation's first window; or why it
    cannot be told (a statement the repeated lines contradict, or neither)."""
    stated = stated_context(read.system)
    repeated = None
    if previous is not None and previous.lines and previous.index == read.index - 1:
        keys = lambda turns: [(t.id, t.speaker, t.text) for t in turns]  # noqa: E731
        before, now = keys(previous.lines), keys(read.lines)
        fits = range(1, min(len(before), len(now) - 1) + 1)  # at least one line stays new
        repeated = max((k for k in fits if before[-k:] == now[:k]), default=0)
    if stated is not None and repeated is not None and stated != repeated:
        return (
            f"the system message says {stated} context messages, but the window repeats "
            f"{repeated} from the previous one"
        )
    if stated is not None or repeated is not None:
        return stated if stated is not None else repeated
    if read.index == 0:
        return 0
    return (
        "cannot tell which messages are context (the system message does not say, and the previous "
        "window is missing)"
    )


def _time(turn: Turn) -> datetime:
    return datetime.fromisoformat(turn.id)


def _said(turn: Turn) -> tuple[str, str]:
    return turn.speaker, turn.text


def read_windows(rows: list[tuple[str, dict]], variant: str = "auto") -> tuple[list[Read], PaperFormat]:
    """Every row as a window of its conversation (in window order), with the variant they speak."""
    order = Counter()
    reads = [_read(where, row, order) for where, row in rows]
    fmt = _variant(reads, variant)
    by_conv: dict[str, list[Read]] = {}
    for read in reads:
        by_conv.setdefault(read.conv_name, []).append(read)
    made: set[str] = set()
    for conv_reads in by_conv.values():
        conv_reads.sort(key=lambda r: r.index)
        every: dict[str, Turn] = {}
        for r in conv_reads:
            if r.problem:
                continue
            clash = next((t for t in r.lines if t.id in every and _said(every[t.id]) != _said(t)), None)
            if clash is not None:  # one time, two messages: the pointers would be ambiguous
                r.problem = f"another window of {r.conv_name} has a different message at {clash.id}"
                continue
            every.update((t.id, t) for t in r.lines)
        session_of = {t.id: t.session_id for t in sessions(sorted(every.values(), key=_time))}
        for previous, read in zip([None, *conv_reads], conv_reads):
            if read.problem:
                continue
            role = {"role": "user"} if fmt.user_only else {}
            read.lines = [replace(t, session_id=session_of[t.id], **role) for t in read.lines]
            lines = read.lines
            k = _context_size(read, previous)
            if isinstance(k, str) or k >= len(lines):
                read.problem = k if isinstance(k, str) else f"all {len(lines)} messages are context"
                continue
            window = Window(read.conv_name, read.index, tuple(lines[:k]), tuple(lines[k:]))
            if window.id in made:
                read.problem = f"a second row for window {read.index} of {read.conv_name}"
                continue
            made.add(window.id)
            read.window = window
    return reads, fmt


def _outcome(read: Read, fmt: PaperFormat, prompt) -> tuple[Outcome, Counter]:
    """The row as a labeled or quarantined job, and the memories' broken rules counted."""
    rounds = [{"answer": read.answer}] if read.answer is not None else []
    if read.window is None:
        job = Job("extract", f"{read.conv_name}#{read.where}", read.conv_name, [], prompt, payload=read.row)
        return Outcome(job, "quarantined", reason=f"{read.where}: {read.problem}", rounds=rounds), Counter()
    w = read.window
    job = Job("extract", w.id, w.conversation_id, extract_messages(w, prompt), prompt, w.scope, w)
    try:
        answer = fmt.to_contract(fmt.decode(read.answer), w)
    except json.JSONDecodeError:
        reason = f"{read.where}: the assistant message holds no JSON object"
        return Outcome(job, "quarantined", reason=reason, rounds=rounds), Counter({"json": 1})
    result = validate("extract", answer, w.scope)
    if result.ok:
        return Outcome(job, "labeled", value=result.value, rounds=rounds), Counter()
    rounds[-1]["issues"] = result.report()
    reason = f"{read.where}: {', '.join(result.rules_broken())}\n{result.report()}"
    return Outcome(job, "quarantined", reason=reason, rounds=rounds), Counter(i.rule for i in result.issues)


def import_paper(
    source: str,
    out: Path,
    split: SplitConfig,
    variant: str = "auto",
    teacher_model: str | None = None,
    license_: str | None = None,
    show_progress: bool = True,
) -> dict:
    """Read the authors' rows, write this project's datagen outputs to `out`; returns the report."""
    rows, stated_license = load_rows(source)
    reads, fmt = read_windows(rows, variant)
    if not any(r.window for r in reads):  # nothing in their layout: say so before writing anything
        first = next((f"{r.where}: {r.problem}" for r in reads), "no rows")
        raise ValueError(f"{source}: no row is a window in the DimMem authors' layout ({first})")
    prompt = load_prompt("extract")
    outcomes, rules = [], Counter()
    for read in progress(reads, desc="importing", unit="row", enabled=show_progress):
        outcome, broken = _outcome(read, fmt, prompt)
        outcomes.append(outcome)
        rules += broken
    teacher = teacher_model or f"unknown (imported from {source})"
    dataset = build_dataset(outcomes, teacher, split.validation, split.test, split.seed, group=template_of)
    good = [o for o in outcomes if o.status != "quarantined"]
    memories = sum(len(o.value["memories"]) for o in good)
    report = {
        "source": source,
        "format": fmt.name,
        "rows": len(rows),
        "windows": sum(r.window is not None for r in reads),
        "other_jobs": 0,
        "labeled": len(good),
        "repaired": 0,
        "quarantined": len(outcomes) - len(good),
        "unreadable_rows": sum(r.window is None for r in reads),
        "memories": memories,
        "rules_broken": dict(rules.most_common()),
        "templates": {
            name: len(set(map(template_of, ds["conversation_id"]))) for name, ds in dataset.items()
        },
        "requests_sent": 0,
        "cache_hits": 0,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
    }
    license_text = license_ or stated_license or "not stated by the source: see its dataset card"
    card = dataset_card(
        dataset, report, fmt.name, source, license_text, teacher, [prompt.id], quarantine_reasons(outcomes)
    )
    card += (
        f"\n## Imported\n\nFrom `{source}` (the DimMem authors' `{fmt.name}` layout) by "
        "`dimmem datagen import`: each memory mapped onto the contract and validated. Splits are by "
        f"template conversation.\n\n**Contamination.** {CONTAMINATION}\n"
    )
    write_outputs(out, dataset, outcomes, report, card)
    return report


def export_paper(folder: Path, out: Path, format_name: str) -> dict:
    """A datagen output's labeled windows as the authors' SFT rows, one `<split>.jsonl` per split in
    `out` (loadable by `datasets.load_dataset("json", ...)`); returns the report of what was written and
    what their format cannot carry."""
    fmt = FORMATS[format_name]
    path = folder / JOBS
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no {JOBS} (not a datagen output folder)")
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation", "test"):  # an earlier export's splits must not linger
        (out / f"{split}.jsonl").unlink(missing_ok=True)
    counts = Counter()
    handles: dict[str, object] = {}
    try:
        for row, window in job_windows(path):
            if row["task"] != "extract" or row["status"] == "quarantined":
                continue
            if "session_offset" not in row["window"]:
                raise ValueError(
                    f"{path}: written before windows recorded where they start in their session, "
                    "which their timestamps need: re-run its datagen command (answers come from its "
                    "cache, nothing is paid again)"
                )
            if not fmt.citable(window):
                counts["windows_showing_no_new_message"] += 1
                continue
            answer, lost = fmt.from_contract(row["value"], window)
            counts["rows"] += 1
            counts["memories"] += len(answer["memories"])
            counts["memories_citing_no_shown_message"] += lost
            shown = set(dict(fmt.lines(window)))
            counts["source_turns_dropped"] += sum(
                max(len([t for t in m["source_turns"] if t in shown]) - 1, 0)
                for m in row["value"]["memories"]
            )
            split = row.get("split") or "train"
            if split not in handles:
                handles[split] = open(out / f"{split}.jsonl", "w", encoding="utf-8")  # noqa: SIM115
            paper_row = {
                "messages": [
                    *fmt.messages(window),
                    {"role": "assistant", "content": fmt.answer_text(answer)},
                ],
                "metadata": {
                    "conv_name": window.conversation_id,
                    "window": window.index,
                    "n_memories": len(answer["memories"]),
                },
            }
            handles[split].write(json.dumps(paper_row, ensure_ascii=False) + "\n")
    finally:
        for handle in handles.values():
            handle.close()
    report = {"format": format_name, "source": str(folder), "splits": sorted(handles), **counts}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
