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


def collect(folder: Path) -> list[dict]:
    """One row per checkpoint step found in `folder` (eval-N/metrics.json and retrieval-N.json)."""
    rows = []
    for metrics_path in folder.glob("eval-*/metrics.json"):
        step = int(re.fullmatch(r"eval-(\d+)", metrics_path.parent.name).group(1))
        retrieval_path = folder / f"retrieval-{step}.json"
        if not retrieval_path.exists():
            raise FileNotFoundError(f"{retrieval_path}: no retrieval run for checkpoint {step}")
        extraction = json.loads(metrics_path.read_text())
        sets = json.loads(retrieval_path.read_text())["sets"]
        raw = sets[f"step{step}"]["rankings"]["fused"]
        consolidated = sets[f"step{step}+consolidation"]["rankings"]["fused"]
        rows.append(
            {
                "step": step,
                "parse_rate": extraction["parse_rate"],
                "memory_f1": extraction["memory_f1"],
                "headline": extraction["headline"],
                "recall@10": raw["all"]["recall@10"],
                "current_fact": consolidated.get("update", {}).get("current_fact", 0.0),
                "records": sets[f"step{step}"]["records"],
            }
        )
    if not rows:
        raise FileNotFoundError(f"{folder}: no eval-N/metrics.json (run make bench-checkpoints)")
    return sorted(rows, key=lambda r: r["step"])


def table(rows: list[dict]) -> str:
    lines = [
        "| step | parse rate | memory F1 | headline | records | toy R@10 | current fact (consolidated) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['parse_rate']:.3f} | {r['memory_f1']:.3f} | {r['headline']:.1f} | "
            f"{r['records']} | {r['recall@10']:.3f} | {r['current_fact']:.3f} |"
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
        values = [r[key] / 100 if key == "headline" else r[key] for r in rows]
        ax.plot(steps, values, marker="o", label=label)
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
    args = parser.parse_args(argv)
    rows = collect(args.folder)
    reference = json.loads(args.reference.read_text()) if args.reference else None
    print(table(rows))
    print(f"plot: {plot(rows, args.plot or args.folder / 'checkpoints.png', reference)}")
    (args.folder / "checkpoints.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
