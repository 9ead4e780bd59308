"""An extraction eval run folder (`dimmem eval extraction --out DIR`) as the inspector reads it: the
metrics and plots, the per-window scores indexed for sorting and paging, and one window's predicted and
reference memories aligned by the metric's own code (`eval.metrics.aligned_memories`). A LoCoMo benchmark
run (`--benchmark locomo`) carries each window's turns, gold observations and kept records, with the
matches the benchmark made, in its windows.jsonl."""

from __future__ import annotations

import threading
from pathlib import Path

from dimmem.contract.records import MEMORY_FIELDS
from dimmem.jsonl_index import Column, JsonlIndex
from eval.metrics import aligned_memories, pair_scores
from eval.report import compare_rows, locomo_metric_rows, metric_rows
from inspector.problems import Problem, read_json

PLOTS = ("fields.png", "confusion.png", "locomo.png")
ORDERS = {"worst": "score, line", "best": "score DESC, line", "file": "line"}


def window_f1(row: dict) -> float:
    """The window's memory F1 (1.0 when there was nothing to find and nothing was found)."""
    total = row["predicted"] + row["reference"]
    return 2 * row["matched"] / total if total else 1.0


WINDOW_COLUMNS = [
    Column("window_id", "TEXT", lambda r: r["window_id"]),
    Column("score", "REAL", window_f1),
    Column("matched", "INTEGER", lambda r: r["matched"]),
    Column("predicted", "INTEGER", lambda r: r["predicted"]),
    Column("reference", "INTEGER", lambda r: r["reference"]),
    Column("valid", "INTEGER", lambda r: int(bool(r.get("valid")))),
    Column("truncated", "INTEGER", lambda r: int(bool(r.get("truncated")))),
    Column("rules", "TEXT", lambda r: ", ".join(r.get("rules") or [])),
]
PREDICTION_COLUMNS = [Column("window_id", "TEXT", lambda r: r["window_id"])]


class EvalRun:
    kind = "eval"

    def __init__(self, folder: Path, index_dir: Path):
        self.folder, self.name = folder, folder.name
        self.metrics = read_json(folder / "metrics.json")
        for name in ("windows.jsonl", "predictions.jsonl"):
            if not (folder / name).is_file():
                raise ValueError(
                    f"{folder}: an eval run folder without {name} (dimmem eval extraction writes it)"
                )
        try:
            self.windows = JsonlIndex(folder / "windows.jsonl", WINDOW_COLUMNS, "window_id", index_dir)
        except KeyError as exc:
            raise ValueError(f"{folder / 'windows.jsonl'}: a line without {exc}") from None
        self.predictions = JsonlIndex(
            folder / "predictions.jsonl", PREDICTION_COLUMNS, "window_id", index_dir
        )
        self.run = self.metrics.get("run", {})
        self.locomo = self.run.get("benchmark") == "locomo"
        self._references: dict | None = None
        self._lock = threading.Lock()

    def summary(self) -> str:
        if self.locomo:
            windows, f1 = self.metrics.get("windows", "?"), _number(self.metrics.get("fact_f1"))
            return f"LoCoMo, {windows} windows, fact F1 {f1}, {self.run.get('model')}"
        headline = self.metrics.get("headline")
        shown = f"{headline:.1f}" if isinstance(headline, (int, float)) else "n/a"
        return f"{self.metrics.get('windows', '?')} windows, headline {shown}, model {self.run.get('model')}"

    def metric_rows(self) -> list[tuple[str, str]]:
        return locomo_metric_rows(self.metrics) if self.locomo else metric_rows(self.metrics)

    def plots(self) -> list[str]:
        return [p for p in PLOTS if (self.folder / p).is_file()]

    def references_folder(self) -> tuple[Path | None, str]:
        """The data_gen output the run was scored against: as written in metrics.json, else the same
        relative path from one of the run folder's parents (the run was made from a working directory)."""
        spec = self.run.get("references") or ""
        folder, _, split = spec.partition(":")
        if not folder:
            return None, split
        candidates = [Path(folder)] + [parent / folder for parent in self.folder.resolve().parents]
        return next((c for c in candidates if c.exists()), None), split

    def references(self) -> dict:
        """window id -> the reference (teacher) answer and turn scope; loaded on first use."""
        with self._lock:
            if self._references is None:
                from eval.extraction import load_references

                folder, split = self.references_folder()
                if folder is None:
                    raise Problem(
                        404,
                        "References not found",
                        f"the run was scored against {self.run.get('references')!r}, which is not there from "
                        f"here or from any parent of {self.folder}; open the inspector from the folder the "
                        "run was made in.",
                    )
                refs = load_references(f"{folder}:{split}" if split else str(folder))
                self._references = {r.window_id: r for r in refs}
            return self._references

    def window(self, window_id: str) -> dict:
        scores = self.windows.get(window_id)
        if scores is None:
            raise Problem(404, "No such window", f"{self.name} scored no window {window_id!r}.")
        scores["score"] = window_f1(scores)
        prediction = self.predictions.get(window_id) or {}
        if self.locomo:  # the window's gold and records are in its row, matched as the benchmark matched them
            return {"scores": scores, "prediction": prediction, "locomo": True}
        reference = self.references().get(window_id)
        if reference is None:
            raise Problem(
                404, "Reference missing", f"{window_id!r} is not in {self.run.get('references')!r}."
            )
        predicted, expected, matches = aligned_memories(prediction.get("output", ""), reference.answer)
        pairs, used_p, used_r = [], set(), set()
        for i, j, similarity in sorted(matches, key=lambda m: m[1]):
            used_p.add(i)
            used_r.add(j)
            pairs.append(
                {
                    "predicted": predicted[i],
                    "reference": expected[j],
                    "fields": field_diff(predicted[i], expected[j]),
                    "scores": pair_scores(predicted[i], expected[j], similarity),
                }
            )
        return {
            "scores": scores,
            "prediction": prediction,
            "prompt": reference.messages[-1]["content"],
            "pairs": pairs,
            "missed": [m for j, m in enumerate(expected) if j not in used_r],
            "invented": [m for i, m in enumerate(predicted) if i not in used_p],
        }


def _number(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "n/a"


def field_diff(predicted: dict, reference: dict) -> list[dict]:
    """Each record field side by side, marked equal or not (keywords and source turns as sets)."""
    rows = []
    for name in MEMORY_FIELDS:
        p, r = predicted.get(name), reference.get(name)
        if isinstance(p, list) and isinstance(r, list):
            same = {str(x).casefold() for x in p} == {str(x).casefold() for x in r}
        else:
            same = p == r
        rows.append({"field": name, "predicted": p, "reference": r, "same": same})
    return rows


def comparison(a: EvalRun, b: EvalRun) -> list[tuple[str, str, str, str]]:
    try:
        return compare_rows(a.metrics, b.metrics)
    except ValueError as exc:
        raise Problem(400, "Runs not comparable", f"{a.name} and {b.name}: {exc}.") from None
