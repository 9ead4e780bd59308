"""An extraction run for people: report.md, per-field and type-confusion plots, side-by-side comparison."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dimmem.contract.records import MEMORY_TYPES  # noqa: E402

# (metrics.json key, label) in the order reports and comparisons show them
HEADLINE_ROWS = (
    ("headline", "headline (0-100)"),
    ("parse_rate", "JSON parse rate"),
    ("schema_valid_rate", "schema-valid rate"),
    ("valid_rate", "passes every validator rule"),
    ("truncation_rate", "truncated at max_tokens"),
    ("memory_precision", "memory precision"),
    ("memory_recall", "memory recall"),
    ("memory_f1", "memory F1"),
    ("type_accuracy", "type accuracy"),
    ("time_exact", "time exact match"),
    ("time_overlap", "time interval overlap"),
    ("keyword_f1", "keyword set F1"),
    ("source_jaccard", "source-turn Jaccard"),
    ("content_similarity", "content token F1"),
    ("location_null_agreement", "location null agreement"),
    ("location_f1", "location token F1"),
    ("reason_null_agreement", "reason null agreement"),
    ("reason_f1", "reason token F1"),
    ("purpose_null_agreement", "purpose null agreement"),
    ("purpose_f1", "purpose token F1"),
    ("field_quality", "field quality (n/a: no matched pair)"),
    ("output_tokens_per_window", "output tokens per window"),
    ("windows_per_s", "windows/s"),
    ("output_tokens_per_s", "output tokens/s"),
)
FIELD_PLOT = (
    "parse_rate",
    "schema_valid_rate",
    "memory_f1",
    "type_accuracy",
    "time_exact",
    "time_overlap",
    "keyword_f1",
    "source_jaccard",
    "content_similarity",
    "location_null_agreement",
    "reason_null_agreement",
    "purpose_null_agreement",
)


def _fmt(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_report(metrics: dict, out: Path) -> Path:
    run = metrics.get("run", {})
    lines = [
        f"# Extraction eval: {run.get('name', out.name)}",
        "",
        f"{metrics['windows']} windows from `{run.get('references')}`; answers from {run.get('source')} "
        f"`{run.get('model')}`; {metrics['memories_reference']} reference memories, "
        f"{metrics['memories_predicted']} predicted, {metrics['memories_matched']} matched.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    lines += [f"| {label} | {value} |" for label, value in metric_rows(metrics)]
    lines += ["", "Rule violations (share of windows):", "", "| rule | rate |", "|---|---|"]
    lines += [f"| {rule} | {rate:.3f} |" for rule, rate in metrics["rule_violation_rate"].items()] or [
        "| (none) | 0 |"
    ]
    lines += [
        "",
        "Type confusion (rows: reference, columns: predicted, matched pairs):",
        "",
        "| | " + " | ".join((*MEMORY_TYPES, "other")) + " |",
        "|---" * (len(MEMORY_TYPES) + 2) + "|",
    ]
    lines += [
        f"| {t} | " + " | ".join(str(v) for v in row.values()) + " |"
        for t, row in metrics["type_confusion"].items()
    ]
    lines += ["", "![per-field scores](fields.png)", "![type confusion](confusion.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def metric_rows(metrics: dict) -> list[tuple[str, str]]:
    """(label, value) per headline metric, formatted as reports show them (n/a: not applicable)."""
    return [(label, _fmt(metrics.get(key))) for key, label in HEADLINE_ROWS]


def plot_run(metrics: dict, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    values = [metrics.get(k) for k in FIELD_PLOT]  # None: not applicable (no matched pair), drawn as no bar
    ax.barh(FIELD_PLOT[::-1], [0.0 if v is None else v for v in values[::-1]], color="#4C72B0")
    for y, v in enumerate(values[::-1]):
        if v is None:
            ax.text(0.01, y, "n/a", va="center", color="grey")
    ax.set(xlim=(0, 1), xlabel="score", title=f"headline {metrics['headline']:.1f}")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fields.png", dpi=110)
    plt.close(fig)

    confusion = metrics["type_confusion"]
    columns = (*MEMORY_TYPES, "other")
    grid = [[confusion[t][c] for c in columns] for t in MEMORY_TYPES]
    fig, ax = plt.subplots(figsize=(4.5, 3.5))
    ax.imshow(grid, cmap="Blues")
    ax.set(
        xticks=range(len(columns)),
        xticklabels=columns,
        yticks=range(len(MEMORY_TYPES)),
        yticklabels=MEMORY_TYPES,
        xlabel="predicted",
        ylabel="reference",
        title="type confusion (matched pairs)",
    )
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center")
    fig.tight_layout()
    fig.savefig(out / "confusion.png", dpi=110)
    plt.close(fig)


def compare(run_a: str | Path, run_b: str | Path) -> str:
    """The side-by-side table of two runs' metrics with B - A."""
    for run in (run_a, run_b):
        if not (Path(run) / "metrics.json").is_file():
            raise FileNotFoundError(f"{run}: not an evaluation run (no metrics.json; dimmem eval writes it)")
    a, b = (json.loads((Path(r) / "metrics.json").read_text()) for r in (run_a, run_b))
    name_a, name_b = Path(run_a).name, Path(run_b).name
    lines = [f"| metric | {name_a} | {name_b} | delta |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in compare_rows(a, b)]
    return "\n".join(lines)


def compare_rows(a: dict, b: dict) -> list[tuple[str, str, str, str]]:
    """(label, A, B, B - A) per headline metric of two runs' metrics.json, formatted as reports show them."""
    rows = []
    for key, label in HEADLINE_ROWS:
        va, vb = a.get(key), b.get(key)
        delta = f"{vb - va:+.3f}" if isinstance(va, (int, float)) and isinstance(vb, (int, float)) else ""
        rows.append((label, _fmt(va), _fmt(vb), delta))
    return rows


def plot_recall_tokens(result: dict, path: Path) -> Path:
    """The toy retrieval benchmark as one picture: fused recall against context tokens per question, one
    curve per memory set (each point one k, from 1 to the largest)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, s in result["sets"].items():
        recall, tokens = s["fused_recall_curve"].get("all"), s["context_tokens_curve"].get("all")
        if recall and tokens and max(recall) > 0:
            ax.plot(tokens, recall, marker=".", label=f"{name} ({s['records']} records)")
    ax.set_xlabel(f"context tokens per question (top k, k = 1..{max(result['k'])})")
    ax.set_ylabel("fused recall@k")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    ax.set_title(f"Toy world: {result['questions']['all']} questions with known evidence")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
