"""An extraction run for people: report.md, per-field and type-confusion plots, side-by-side comparison."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dimmem.contract.annotations import DIMENSION_KEYS  # noqa: E402
from dimmem.contract.records import DIMENSIONS, MEMORY_TYPES  # noqa: E402

# (metrics.json key, label) in the order reports and comparisons show them
HEADLINE_ROWS = (
    ("headline", "headline (0-100)"),
    ("parse_rate", "JSON parse rate"),
    ("schema_valid_rate", "schema-valid rate"),
    ("valid_rate", "passes every validator rule"),
    ("truncation_rate", "truncated at max_tokens"),
    ("cut_answers", "answers cut at max_tokens"),
    ("emitted", "memories written (the precisions' denominator)"),
    ("memory_precision", "memory precision"),
    ("memory_recall", "memory recall"),
    ("memory_f1", "memory F1"),
    ("type_accuracy", "type accuracy"),
    ("time_exact", "time exact match"),
    ("time_overlap", "time interval overlap"),
    ("keyword_f1", "keyword set F1"),
    ("source_jaccard", "source-turn Jaccard"),
    ("content_similarity", "content token F1"),
    *(
        row
        for name in DIMENSIONS
        for row in ((f"{name}_null_agreement", f"{name} null agreement"), (f"{name}_f1", f"{name} token F1"))
    ),
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
    *(f"{name}_null_agreement" for name in DIMENSIONS),
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
    kinds = {m.get("benchmark", "references") for m in (a, b)}
    if len(kinds) > 1:
        raise ValueError("one run was scored against LoCoMo's annotations, the other against references")
    rows = []
    for key, label in LOCOMO_KEYS if kinds == {"locomo"} else HEADLINE_ROWS:
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


# --- the LoCoMo extraction benchmark (eval/extraction_locomo.py) ------------------------------------

LOCOMO_ROWS = (  # (metric prefix, label): recall, precision and F1 of each
    ("pointer", "pointers (evidence turn cited, turn level)"),
    ("fact", "facts by content (cosine)"),
    ("fact_pointer", "facts by content and pointer (cosine)"),
    ("fact_lexical", "facts by content (token F1)"),
    ("fact_lexical_pointer", "facts by content and pointer (token F1)"),
)
LOCOMO_FORMAT = (
    ("parse_rate", "JSON parse rate"),
    ("schema_valid_rate", "schema-valid rate"),
    ("valid_rate", "passes every validator rule"),
    ("truncation_rate", "truncated at max_tokens"),
    ("cut_answers", "answers cut at max_tokens"),
    ("emitted", "memories written (the precisions' denominator)"),
    ("records_per_window", "records kept per window"),
    ("tokens_per_record", "tokens per record (Qwen3)"),
    ("time_format_rate", "memories with a well-formed time"),
    ("overlap_violation_rate", "memories citing overlap context"),
    ("rejected_memories", "memories the validator refused"),
    ("repeated_memories", "memories repeated word for word"),
    ("failed_windows", "windows with no usable answer"),
)


LOCOMO_KEYS = (  # (metrics.json key, label) of every LoCoMo metric, as the inspector and compare list them
    *(
        (f"{prefix}_{kind}", f"{label}: {kind if kind != 'f1' else 'F1'}")
        for prefix, label in LOCOMO_ROWS
        for kind in ("recall", "precision", "f1")
    ),
    ("event_recall", "events: recall"),
    ("event_time_recall", "events, time agrees: recall"),
    ("speaker_accuracy", "content matches about the right person"),
    ("wrong_person_rate", "memories stating the other person's observation"),
    *(
        (f"{d}_{kind}", f"{d} (read from the dialogue): {kind}")
        for d in DIMENSION_KEYS
        for kind in ("precision", "recall")
    ),
    *LOCOMO_FORMAT,
)


def _with_ci(metrics: dict, key: str) -> str:
    value, ci = metrics.get(key), (metrics.get("ci") or {}).get(key)
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and value is not None else _fmt(value)


def locomo_metric_rows(metrics: dict) -> list[tuple[str, str]]:
    """(label, value with its 95% interval where it has one) per LoCoMo metric."""
    return [(label, _with_ci(metrics, key)) for key, label in LOCOMO_KEYS]


def _windowing(windows: dict) -> str:
    """`25/5`, or `25/5, prompts within 1280 tokens of TOKENIZER` when a budget cut them."""
    shape = f"{windows['window']}/{windows['overlap']}"
    if windows.get("max_tokens"):
        return f"{shape}, prompts within {windows['max_tokens']} tokens of `{windows['tokenizer']}`"
    return shape


def locomo_summary(metrics: dict, out: Path) -> str:
    """The one line the command prints."""
    return (
        f"{metrics['windows']} windows of {len(metrics['conversations'])} conversations, "
        f"{metrics['emitted']} memories written, {metrics['records']} kept: "
        f"fact F1 {metrics['fact_f1']:.3f}, "
        f"fact+pointer F1 {metrics['fact_pointer_f1']:.3f} (precision over everything written "
        f"{_fmt(metrics['fact_precision'])}), pointer F1 {metrics['pointer_f1']:.3f}, "
        f"{metrics['cut_answers']} answers cut  ->  {out}/report.md"
    )


def _sensitivity_rows(metrics: dict) -> list[str]:
    lines = []
    for measure, values in metrics.get("sensitivity", {}).items():
        lines += [
            f"| {measure} threshold | " + " | ".join(values) + " |",
            "|---|" + "---|" * len(values),
            "| fact F1 | " + " | ".join(f"{v:.3f}" for v in values.values()) + " |",
            "",
        ]
    return lines


def _dimension_rows(metrics: dict) -> list[str]:
    counts, fill = metrics["counts"], metrics.get("dimension_fill") or {}
    lines = [
        "| dimension | matched pairs read | gold states it | record fills it | precision | recall | "
        "filled in all records |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in DIMENSION_KEYS:
        cells = [str(counts.get(f"{d}_{k}", 0)) for k in ("pairs", "gold", "predicted")]
        cells += [_with_ci(metrics, f"{d}_precision"), _with_ci(metrics, f"{d}_recall"), _fmt(fill.get(d))]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return lines


def _conversation_rows(metrics: dict) -> list[str]:
    lines = [
        "| conversation | observations | records | pointer F1 | fact recall | fact precision "
        "| event recall |",
        "|---|---|---|---|---|---|---|",
    ]
    for cid, c in metrics["per_conversation"].items():
        cells = [str(c["observations"]), str(c["records"]), _fmt(c["pointer_f1"])]
        cells += [_with_ci(c, key) for key in ("fact_recall", "fact_precision", "event_recall")]
        lines.append(f"| {cid} | " + " | ".join(cells) + " |")
    return lines


def write_locomo_report(metrics: dict, out: Path) -> Path:
    run, thresholds, counts = metrics["run"], metrics["thresholds"], metrics["counts"]
    how = (
        "given in the config"
        if thresholds["given"]
        else "fitted on the other conversations of the input (leave one conversation out), "
        + thresholds["fitted"]["fitted_on"]
    )
    ranges = ", ".join(
        f"{m} {min(v):.3f}" + (f"-{max(v):.3f}" if len(v) > 1 else "")
        for m, v in thresholds["measures"].items()
    )
    lines = [
        f"# LoCoMo extraction benchmark: {run['name']}",
        "",
        f"Answers from {run['source']} `{run['model']}` on {metrics['windows']} windows "
        f"({_windowing(run['windows'])}) of `{run['input']}`; "
        f"scored conversations: {', '.join(metrics['conversations'])} ({metrics['sessions']} sessions). "
        f"{counts.get('observations', 0)} observations, {counts.get('events', 0)} events; "
        f"{metrics['emitted']} memories written, {metrics['records']} kept, "
        f"{metrics['rejected_memories']} refused, {metrics['repeated_memories']} repeated, "
        f"{metrics['cut_answers']} answers cut at their budget.",
        "",
        f"A record states a gold memory at similarity >= the threshold ({ranges}), {how}, and only when "
        "it is about the gold's person: the first participant its content names is that person, and so is "
        "its speaker (or the speaker of the evidence, where the person speaks none). Precision is over "
        "everything the extractor wrote: refused, repeated and cut-off memories, and a failed answer, count "
        "against it. "
        f"95% intervals: {run['bootstrap']} bootstrap resamples of the sessions.",
        "",
        "| gold | recall | precision | F1 |",
        "|---|---|---|---|",
    ]
    for prefix, label in LOCOMO_ROWS:
        lines.append(
            f"| {label} | {_with_ci(metrics, prefix + '_recall')} | "
            f"{_with_ci(metrics, prefix + '_precision')} | {_fmt(metrics[prefix + '_f1'])} |"
        )
    lines += [
        f"| events (cosine) | {_with_ci(metrics, 'event_recall')} | | |",
        f"| events, record time within {run['event_days']} days before the session | "
        f"{_with_ci(metrics, 'event_time_recall')} | | |",
        "",
        f"Whose fact: of the records that state an observation by content (any person), "
        f"{_fmt(metrics.get('speaker_accuracy'))} are about its person; "
        f"{_fmt(metrics.get('wrong_person_rate'))} of everything written states the other person's.",
        "",
        "Fact F1 (cosine, and token F1 alike) at other thresholds, the same alignment:",
        "",
        *_sensitivity_rows(metrics),
        "Dimensions of the matched facts against the ones read from the dialogue "
        "(docs/locomo-dimensions.md): time as dates (within the gold's span, a day's slack), the others "
        "as phrases.",
        "",
        *_dimension_rows(metrics),
        "",
        "| format | value |",
        "|---|---|",
        *(f"| {label} | {_fmt(metrics.get(key))} |" for key, label in LOCOMO_FORMAT),
        "",
        "Per conversation (fact: cosine, content only):",
        "",
        *_conversation_rows(metrics),
        "",
        "What the gold cannot say: LoCoMo's observations carry no type, so type is not scored. Observations "
        "are incomplete: a true memory they do not list counts against precision, which is therefore a lower "
        "bound. A reading sample of matched and unmatched records is in sample.md.",
        "",
        "![LoCoMo extraction](locomo.png)",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def plot_locomo(metrics: dict, out: Path) -> Path:
    """Recall and precision of each gold with its 95% interval, and fact recall per conversation."""
    bars = [(f"{p}_recall", f"{label}: recall") for p, label in LOCOMO_ROWS]
    bars += [(f"{p}_precision", f"{label}: precision") for p, label in LOCOMO_ROWS]
    bars += [("event_recall", "events: recall"), ("event_time_recall", "events, time agrees: recall")]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [2.2, 1]}, constrained_layout=True
    )
    values = [metrics.get(k) or 0.0 for k, _ in bars]
    errors = np.array(
        [
            [v - (metrics["ci"].get(k) or [v, v])[0], (metrics["ci"].get(k) or [v, v])[1] - v]
            for (k, _), v in zip(bars, values)
        ]
    ).T
    y = np.arange(len(bars))[::-1]
    left.barh(y, values, xerr=errors, color=["#4C72B0" if "recall" in k else "#DD8452" for k, _ in bars])
    left.set(yticks=y, yticklabels=[label for _, label in bars], xlim=(0, 1), xlabel="score (95% interval)")
    left.tick_params(axis="y", labelsize=8)
    left.grid(axis="x", alpha=0.3)
    conversations = list(metrics["per_conversation"])
    recall = [metrics["per_conversation"][c].get("fact_recall") or 0.0 for c in conversations]
    precision = [metrics["per_conversation"][c].get("fact_precision") or 0.0 for c in conversations]
    x = np.arange(len(conversations))
    right.bar(x - 0.2, recall, 0.4, label="fact recall", color="#4C72B0")
    right.bar(x + 0.2, precision, 0.4, label="fact precision", color="#DD8452")
    right.set(xticks=x, ylim=(0, 1), title="per conversation")
    right.set_xticklabels(conversations, rotation=60, fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle(f"LoCoMo extraction: {metrics['run']['source']} {metrics['run']['model']}")
    path = out / "locomo.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
