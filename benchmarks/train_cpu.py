"""Training throughput of the tiny CPU profile, each throughput setting off and on, side by side in one run.

Every variant of `configs/train/tiny-bench.yaml` trains the tiny profile for a few steps through
`train.sft.train`, in rounds (the order reversed every other round, so a neighbour's load on a shared
machine falls on all of them); the table sums each variant's rounds and gives the ratios to the first
(baseline) variant: real tokens per second of wall time and of process CPU time, padding efficiency.

    python -m benchmarks.train_cpu --rounds 2 --json runs/bench/train-cpu.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dimmem.config import Section, add_set_argument, load_config
from dimmem.paths import CONFIG_DIR
from train.args import parse_args
from train.sft import train


class BenchConfig(Section):
    train: dict  # fields (TRL's and DimMem's names) every variant overrides in the profile
    variants: dict[str, dict]  # name -> its own fields; the first is the baseline


def flags(fields: dict) -> list[str]:
    return [
        arg
        for key, value in fields.items()
        for arg in (f"--{key}", str(value).lower() if isinstance(value, bool) else str(value))
    ]


def run_variant(profile: str, fields: dict, out: Path) -> dict:
    train(*parse_args(["--config", profile, *flags(fields), "--output_dir", str(out)]))
    return json.loads((out / "dimmem_train.json").read_text())["throughput"]


def table(results: dict[str, list[dict]]) -> list[dict]:
    """Per variant, its rounds summed: tokens/s = all real tokens / all timed seconds."""
    rows = []
    for name, runs in results.items():
        real = sum(r["real_tokens"] for r in runs)
        seconds = sum(r["step_s"] * r["steps_timed"] for r in runs)
        cpu = sum(r["real_tokens"] / r["real_tokens_per_cpu_s"] for r in runs)
        rows.append(
            {
                "variant": name,
                "steps_timed": sum(r["steps_timed"] for r in runs),
                "real_tokens_per_s": round(real / seconds, 1),
                "real_tokens_per_cpu_s": round(real / cpu, 1),
                "padding_efficiency": round(real / sum(r["token_slots"] for r in runs), 4),
                "peak_memory_gib": max(r["peak_memory_gib"] for r in runs),
            }
        )
    base = rows[0]
    for row in rows:
        for key in ("real_tokens_per_s", "real_tokens_per_cpu_s", "padding_efficiency"):
            row[f"{key}_ratio"] = round(row[key] / base[key], 3)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=str(CONFIG_DIR / "train" / "tiny.yaml"))
    parser.add_argument("--bench-config", default=str(CONFIG_DIR / "train" / "tiny-bench.yaml"))
    parser.add_argument(
        "--rounds", type=int, default=2, help="runs of every variant, order reversed each round"
    )
    parser.add_argument("--json", help="write the table here")
    add_set_argument(parser, "train.max_steps=4")
    args = parser.parse_args(argv)
    bench = load_config(BenchConfig, args.bench_config, args.overrides)
    names = list(bench.variants)
    results: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="dimmem-bench-cpu-") as work:
        for round_ in range(args.rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                out = Path(work) / f"{round_}-{names.index(name)}"
                results[name].append(run_variant(args.profile, {**bench.train, **bench.variants[name]}, out))
    rows = table(results)
    columns = ("real_tokens_per_s", "real_tokens_per_cpu_s", "padding_efficiency")
    width = max(len(name) for name in ["variant", *names])
    print(f"\n{'variant':<{width}}" + "".join(f" {c.replace('real_', ''):>21} {'ratio':>6}" for c in columns))
    for r in rows:
        print(f"{r['variant']:<{width}}" + "".join(f" {r[c]:>21} {r[c + '_ratio']:>6}" for c in columns))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "variants": rows}, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
