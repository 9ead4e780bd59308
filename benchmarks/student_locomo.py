"""Extractors on LoCoMo conversations no student trained on, side by side in one run: the rule extractor,
the annotation labels themselves (the ceiling: what the annotations teacher writes for these windows), and
each student under the window's structured outputs: a student folder (an adapter export with its GGUF
LoRA: what `extractor: student` runs) on llama.cpp, or a merged export on vLLM. Then LLM-free retrieval on
the same conversations over raw turns, LoCoMo's observations, the labels and each student's records.

    python -m benchmarks.student_locomo --student-folder qwen-0.5b=dimmem/students/qwen25-coder-0.5b-locomo \\
        --out runs/student/heldout [--predictions NAME=FILE] [--conversations conv-26,conv-30]

`--student-folder NAME=FOLDER` runs a student folder on llama.cpp exactly as the runtime does (the base
from its chunk packages, the adapter over it, greedy, the runtime's `student` settings); `--student
NAME=EXPORT` serves a merged `dimmem export` folder (vLLM, `.venv-vllm`); `--predictions
NAME=FILE` re-scores stored answers (a run's predictions.jsonl, e.g. benchmarks/results/) and `--labels
NAME=FILE` a datagen labels.jsonl of the same windows, both without a model.
Every row is a `dimmem eval extraction --benchmark locomo` run folder under OUT; the table is OUT/table.md,
the numbers OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from data_gen.config import DatagenConfig
from data_gen.run import run as run_datagen
from dimmem.config import load_config
from dimmem.launch import free_port
from dimmem.paths import CONFIG_DIR, write_json
from eval.cli import main as eval_main
from serve.vllm import SERVED_NAME, vllm_service

HELD_OUT = ["conv-26", "conv-30"]
LABELS_CONFIG = CONFIG_DIR / "datagen" / "locomo-annotations.yaml"
MAX_TOKENS = 2048  # an answer of LoCoMo's densest windows (20+ observations) fits
MAX_MODEL_LEN = 6144  # the longest 25/5 prompt (3.2k tokens) and the answer budget


def pair(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def ceiling_labels(out: Path, conversations: list[str]) -> Path:
    """The annotations teacher's labels for the held-out windows (the same rules as training's)."""
    cfg = load_config(
        DatagenConfig,
        LABELS_CONFIG,
        {
            "out": str(out / "labels-datagen"),
            "source.exclude": [],
            "source.include": conversations,
            "augment.renamed_copies": 0,
        },
    )
    run_datagen(cfg, show_progress=False)
    return Path(cfg.out) / "labels.jsonl"


def extraction(out: Path, name: str, conversations: list[str], *source: str) -> dict:
    folder = out / name
    args = ["extraction", "--benchmark", "locomo", "--conversations", ",".join(conversations)]
    if eval_main([*args, *source, "--out", str(folder)]) != 0:
        raise SystemExit(f"{name}: the extraction run failed (its message is above)")
    return json.loads((folder / "metrics.json").read_text())


def endpoint(port: int, concurrency: int) -> list[str]:
    """`dimmem eval extraction` flags for the extractor served on this machine's `port`: a CPU answers
    one long window in minutes while the others in flight share it, so the timeout is long."""
    url = f"http://127.0.0.1:{port}/v1"
    return [
        *("--base-url", url, "--model", SERVED_NAME, "--concurrency", str(concurrency)),
        *("--set", "model.timeout=1800", "--set", "model.max_retries=1"),
    ]


def served(out: Path, name: str, export: str, conversations: list[str]) -> dict:
    port = free_port()
    log = out / f"{name}.vllm.log"
    with vllm_service(log, port, model=export, max_model_len=MAX_MODEL_LEN):
        return extraction(out, name, conversations, *endpoint(port, 8), "--max-tokens", str(MAX_TOKENS))


def on_llama_cpp(out: Path, name: str, folder: str, conversations: list[str]) -> dict:
    """A student folder served as `extractor: student` serves it: its base and adapter on llama.cpp."""
    from dimmem.runtime.config import StudentConfig
    from dimmem.runtime.student import student_service

    settings, port = StudentConfig(), free_port()
    with student_service(Path(folder), out / f"{name}.llamacpp.log", port, settings):
        flags = [*endpoint(port, settings.parallel), "--max-tokens", str(settings.max_tokens)]
        return extraction(out, name, conversations, *flags)


def retrieval(out: Path, name: str, memories: str, conversations: list[str]) -> dict:
    path = out / f"retrieval-{name}.json"
    args = ["retrieval", "--benchmark", "locomo", "--memories", memories, "--k", "10"]
    args += ["--conversations", ",".join(conversations), "--out", str(path)]
    if eval_main([*args, "--input", str(_locomo())]) != 0:
        raise SystemExit(f"retrieval over {name} failed (its message is above)")
    return json.loads(path.read_text())


def _locomo() -> Path:
    from dimmem.paths import shared_data

    return shared_data("locomo/locomo10.json")


DIMENSIONS = ("time", "location", "reason", "purpose")


def _f(m: dict, key: str, digits: int = 3) -> str:
    value = m.get(key)
    return "n/a" if value is None else f"{value:.{digits}f}"


def row(name: str, m: dict) -> str:
    fill = " / ".join(_f(m["dimension_fill"], d, 2) for d in DIMENSIONS)
    speed = _f(m, "windows_per_s") if m.get("windows_per_s") else "-"
    facts = f"{_f(m, 'fact_recall')} / {_f(m, 'fact_precision')} / **{m['fact_f1']:.3f}**"
    cells = [
        f"{m['records_per_window']:.2f}",
        f"{m['pointer_f1']:.3f}",
        facts,
        f"**{m['fact_pointer_f1']:.3f}**",
        _f(m, "wrong_person_rate"),
        str(m["cut_answers"]),
        f"{m['rejected_memories']} / {m['repeated_memories']}",
        fill,
        _f(m, "event_recall"),
        _f(m, "tokens_per_record", 0),
        speed,
    ]
    return f"| {name} | " + " | ".join(cells) + " |"


def dimension_row(name: str, m: dict) -> str:
    return (
        f"| {name} | "
        + " | ".join(f"{_f(m, d + '_precision', 2)} / {_f(m, d + '_recall', 2)}" for d in DIMENSIONS)
        + " |"
    )


def sweep_row(name: str, m: dict) -> str:
    return f"| {name} | " + " / ".join(f"{v:.3f}" for v in m["sensitivity"]["cosine"].values()) + " |"


def table(rows: dict[str, dict], recall: dict[str, dict]) -> str:
    cosines = " / ".join(next(iter(rows.values()))["sensitivity"]["cosine"])
    lines = [
        "| extractor | records / window | pointer F1 | fact R / P / **F1** | **fact+pointer F1** "
        "| wrong person | answers cut | refused / repeated | filled: time / location / reason / purpose "
        "| event R | tokens / record | windows/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(row(name, m) for name, m in rows.items()),
        "",
        "| extractor | " + " | ".join(f"{d} P / R" for d in DIMENSIONS) + " |",
        "|---|---|---|---|---|",
        *(dimension_row(name, m) for name, m in rows.items()),
        "",
        f"| extractor | fact F1 at cosine {cosines} |",
        "|---|---|",
        *(sweep_row(name, m) for name, m in rows.items()),
        "",
        "| memories | records | evidence R@10 | tokens@10 |",
        "|---|---|---|---|",
    ]
    for name, r in recall.items():
        fused = r["fused"]
        lines.append(f"| {name} | {r['records']} | {fused['recall@10']:.3f} | {fused['tokens@10']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.student_locomo", description=__doc__)
    parser.add_argument(
        "--student-folder", type=pair, action="append", default=[], help="NAME=STUDENT_FOLDER (llama.cpp)"
    )
    parser.add_argument("--student", type=pair, action="append", default=[], help="NAME=EXPORT_DIR (vLLM)")
    parser.add_argument(
        "--predictions", type=pair, action="append", default=[], help="NAME=predictions.jsonl"
    )
    parser.add_argument("--labels", type=pair, action="append", default=[], help="NAME=labels.jsonl")
    parser.add_argument("--conversations", default=",".join(HELD_OUT))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out, conversations = Path(args.out), args.conversations.split(",")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    labels = ceiling_labels(out, conversations)
    rows = {
        "rule extractor (every turn a record)": extraction(
            out, "rule", conversations, "--extractor", "turns"
        ),
        "annotation labels (the ceiling)": extraction(out, "labels", conversations, "--labels", str(labels)),
    }
    for name, path in args.predictions:
        rows[name] = extraction(out, name, conversations, "--predictions", path)
    for name, path in args.labels:
        rows[name] = extraction(out, name, conversations, "--labels", path)
    for name, folder in args.student_folder:
        rows[name] = on_llama_cpp(out, name, folder, conversations)
    for name, export in args.student:
        rows[name] = served(out, name, export, conversations)
    memory_sets = {
        "raw turns": "turns",
        "LoCoMo observations": "observations",
        "annotation labels": str(labels),
    }
    names = [n for n, _ in [*args.predictions, *args.labels, *args.student_folder, *args.student]]
    memory_sets |= {name: str(out / name / "records.jsonl") for name in names}
    recall = {
        name: retrieval(out, name.replace(" ", "-"), m, conversations) for name, m in memory_sets.items()
    }

    text = table(rows, recall)
    (out / "table.md").write_text(text + "\n")
    write_json(
        out / "summary.json",
        {
            "conversations": conversations,
            "extraction": rows,
            "retrieval": {n: {"records": r["records"], **r["fused"]} for n, r in recall.items()},
            "wall_s": round(time.perf_counter() - started, 1),
        },
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
