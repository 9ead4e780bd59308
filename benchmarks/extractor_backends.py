"""One extractor under each CPU backend and setting, side by side in one run: transformers generation,
vLLM for CPU, llama.cpp on a merged export's GGUF files (f16, q8_0, q4_k_m), and a student folder (its
base GGUF with the adapter folded in, as `extractor: student` runs it, or applied at run time) plain, with
n-gram drafting (`--draft`) and with windows decoded in parallel slots. The same windows, the same greedy
decoding and budget; each row is a `dimmem eval extraction` run folder under OUT.

    python -m benchmarks.extractor_backends --export runs/student/export-ck60-gguf \\
        --references runs/student/heldout/labels-datagen:train --limit 8 --out runs/bench/backends
    python -m benchmarks.extractor_backends --student-folder dimmem/students/qwen25-coder-0.5b-locomo \\
        --backends student,student-lora,student-ngram-map-k --references ... --out ...

Table in OUT/table.md, numbers in OUT/summary.json; speed is relative to the first row measured in the
same run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.student_locomo import endpoint
from dimmem.launch import free_port
from dimmem.llamacpp import llamacpp_service
from dimmem.paths import read_export_config, write_json
from eval.cli import main as eval_main
from serve.vllm import vllm_service


def extraction(out: Path, name: str, common: list[str], *source: str) -> dict:
    folder = out / name
    if eval_main(["extraction", *common, *source, "--out", str(folder)]) != 0:
        raise SystemExit(f"{name}: the extraction run failed (its message is above)")
    return json.loads((folder / "metrics.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.extractor_backends", description=__doc__)
    parser.add_argument("--export", help="a merged export folder written with --gguf")
    parser.add_argument("--student-folder", help="a student folder (adapter export with its GGUF LoRA)")
    parser.add_argument("--references", required=True, help="DIR[:split] of windows with reference labels")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--backends", default="transformers,vllm,llamacpp", help="which rows to run")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = [
        "--references",
        args.references,
        "--limit",
        str(args.limit),
        "--max-tokens",
        str(args.max_tokens),
    ]
    backends = args.backends.split(",")
    started = time.perf_counter()
    rows: dict[str, dict] = {}
    if args.student_folder:
        rows |= student_rows(
            Path(args.student_folder), [b for b in backends if b.startswith("student")], out, common
        )
    if args.export:
        rows |= export_rows(Path(args.export), backends, out, common)
    text = table(rows)
    (out / "table.md").write_text(text + "\n")
    write_json(
        out / "summary.json",
        {
            "export": args.export,
            "student": args.student_folder,
            "rows": rows,
            "wall_s": round(time.perf_counter() - started, 1),
        },
    )
    print(text)
    return 0


ROW_NAMES = {  # a student row's name in the table, by its setting
    "": "base + LoRA merged (Q8_0), plain",
    "lora": "base + LoRA at run time, plain",
}


def student_rows(folder: Path, backends: list[str], out: Path, common: list[str]) -> dict[str, dict]:
    """`student`: the folder as the runtime runs it (the adapter folded into a Q8_0 copy of the base);
    `student-lora`: the adapter applied at run time over the base, as trained; `student-<draft>`: with
    that n-gram drafting; `student-parallel-N`: N windows decoded together (N requests in flight)."""
    from dimmem.runtime.config import StudentConfig
    from dimmem.runtime.student import student_service

    rows = {}
    for backend in backends:
        setting = backend.removeprefix("student").removeprefix("-")
        flags: dict = {"parallel": 1, "draft": "none"}
        if setting.startswith("parallel-"):
            flags["parallel"] = int(setting.removeprefix("parallel-"))
        elif setting == "lora":
            flags["no_merge"] = True
        elif setting:
            flags["draft"] = setting
        port = free_port()
        with student_service(folder, out / f"{backend}.log", port, StudentConfig(), **flags):
            rows[ROW_NAMES.get(setting, f"merged, {setting}")] = extraction(
                out, backend, common, *endpoint(port, flags["parallel"])
            )
    return rows


def export_rows(export: Path, backends: list[str], out: Path, common: list[str]) -> dict[str, dict]:
    meta = read_export_config(export)
    if not meta.get("merged") or not meta.get("gguf"):
        raise SystemExit(f"{export}: export the run with --merge --gguf f16,q8_0,q4_k_m first")
    rows: dict[str, dict] = {}
    if "transformers" in backends:
        rows["transformers (fp32)"] = extraction(out, "transformers", common, "--hf-model", str(export))
    if "vllm" in backends:
        port = free_port()
        with vllm_service(out / "vllm.log", port, model=str(export)):
            rows["vLLM CPU (fp32)"] = extraction(out, "vllm", common, *endpoint(port, 1))
    if "llamacpp" in backends:
        for kind in meta["gguf"]:
            port = free_port()
            with llamacpp_service(out / f"llamacpp-{kind}.log", export, port, quant=kind):
                rows[f"llama.cpp {kind}"] = extraction(out, f"llamacpp-{kind}", common, *endpoint(port, 1))
    return rows


def table(rows: dict[str, dict]) -> str:
    first = next(iter(rows.values()))
    lines = [
        "| backend | windows/s | output tokens/s | speed vs first row | parse | schema-valid | cut at budget "
        "| memory F1 | F1 vs first row |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in rows.items():
        lines.append(
            f"| {name} | {m['windows_per_s']:.3f} | {m['output_tokens_per_s']:.1f} | "
            f"{m['windows_per_s'] / first['windows_per_s']:.2f}x | {m['parse_rate']:.3f} | "
            f"{m['schema_valid_rate']:.3f} | {m['truncation_rate']:.3f} | {m['memory_f1']:.3f} | "
            f"{m['memory_f1'] - first['memory_f1']:+.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
