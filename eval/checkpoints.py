"""Quality propagates: extraction quality of a model's training checkpoints against the retrieval
quality of the records each extracts, as one table and one plot. `make bench-checkpoints` trains the
tiny profile keeping a checkpoint every 60 steps, exports each, and runs per checkpoint N:

    dimmem eval extraction ... --out DIR/eval-N                       # headline, memory F1
    dimmem eval retrieval --benchmark toy --extractor stepN=... --out DIR/retrieval-N.json

then `python -m eval.checkpoints DIR --plot docs/img/checkpoints.png` reads them back."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from eval.report import plt

RETRIEVAL = ("recall@10", "current_fact", "records")


def collect(folder: Path, extraction_only: bool = False) -> list[dict]:
    """One row per checkpoint step found in `folder` (eval-N/metrics.json and retrieval-N.json). With
    `extraction_only`, a checkpoint without its retrieval run keeps None in the retrieval columns."""
    rows = []
    for metrics_path in folder.glob("eval-*/metrics.json"):
        step = int(re.fullmatch(r"eval-(\d+)", metrics_path.parent.name).group(1))
        extraction = json.loads(metrics_path.read_text())
        row = {
            "step": step,
            "parse_rate": extraction["parse_rate"],
            "memory_f1": extraction["memory_f1"],
            "headline": extraction["headline"],
            **dict.fromkeys(RETRIEVAL),
        }
        retrieval_path = folder / f"retrieval-{step}.json"
        if retrieval_path.exists():
            sets = json.loads(retrieval_path.read_text())["sets"]
            consolidated = sets[f"step{step}+consolidation"]["rankings"]["fused"]
            row |= {
                "recall@10": sets[f"step{step}"]["rankings"]["fused"]["all"]["recall@10"],
                "current_fact": consolidated.get("update", {}).get("current_fact", 0.0),
                "records": sets[f"step{step}"]["records"],
            }
        elif not extraction_only:
            raise FileNotFoundError(
                f"{retrieval_path}: no retrieval run for checkpoint {step} (--extraction-only accepts that)"
            )
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"{folder}: no eval-N/metrics.json (run make bench-checkpoints)")
    return sorted(rows, key=lambda r: r["step"])


def table(rows: list[dict]) -> str:
    lines = [
        "| step | parse rate | memory F1 | headline | records | toy R@10 | current fact (consolidated) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        recall, current = (f"{r[k]:.3f}" if r[k] is not None else "not run" for k in RETRIEVAL[:2])
        lines.append(
            f"| {r['step']} | {r['parse_rate']:.3f} | {r['memory_f1']:.3f} | {r['headline']:.1f} | "
            f"{r['records'] if r['records'] is not None else 'not run'} | {recall} | {current} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, reference: dict | None = None) -> Path:
    """`reference`: a toy retrieval result whose raw turns and ground-truth records give the R@10 lines
    an extractor is measured against."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    steps = [r["step"] for r in rows]
    for key, label in (
        ("memory_f1", "memory F1 (extraction)"),
        ("headline", "headline / 100 (extraction)"),
        ("recall@10", "toy retrieval R@10 of its records"),
        ("current_fact", "current-fact accuracy (consolidated)"),
    ):
        points = [
            (r["step"], r[key] / 100 if key == "headline" else r[key]) for r in rows if r[key] is not None
        ]
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    for name, style in (("records", ":"), ("turns", "--")):
        if reference and name in reference["sets"]:
            value = reference["sets"][name]["rankings"]["fused"]["all"]["recall@10"]
            ax.axhline(value, color="grey", linestyle=style, label=f"R@10 of {name} ({value:.3f})")
    ax.set_xlabel("training step (checkpoint)")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(steps)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Extraction quality against retrieval quality, per checkpoint")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.checkpoints", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where make bench-checkpoints wrote eval-N and retrieval-N")
    parser.add_argument("--plot", type=Path, help="write the plot here (default: FOLDER/checkpoints.png)")
    parser.add_argument(
        "--reference", type=Path, help="a toy retrieval result (make demo's) for the turns and records lines"
    )
    parser.add_argument(
        "--extraction-only",
        action="store_true",
        help="accept checkpoints without a retrieval-N.json (their retrieval columns say 'not run')",
    )
    args = parser.parse_args(argv)
    rows = collect(args.folder, args.extraction_only)
    reference = json.loads(args.reference.read_text()) if args.reference else None
    print(table(rows))
    print(f"plot: {plot(rows, args.plot or args.folder / 'checkpoints.png', reference)}")
    (args.folder / "checkpoints.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
