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
import re
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
    "portable": "merged, the wheel's llama.cpp (portable)",
}


def student_rows(folder: Path, backends: list[str], out: Path, common: list[str]) -> dict[str, dict]:
    """`student`: the folder as the runtime runs it (the adapter folded into a Q8_0 copy of the base, on
    llama.cpp compiled for this CPU where `make llamacpp-native` built it); `student-portable`: the same on
    the wheel's llama.cpp; `student-lora`: the adapter applied at run time over the base, as trained;
    `student-<draft>`: with that n-gram drafting; `student-parallel-N`: N windows decoded together (N
    requests in flight)."""
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
        elif setting == "portable":
            flags["portable"] = True
        elif setting:
            flags["draft"] = setting
        port, log = free_port(), out / f"{backend}.log"
        with student_service(folder, log, port, StudentConfig(), **flags):
            row = extraction(out, backend, common, *endpoint(port, flags["parallel"]))
        rows[ROW_NAMES.get(setting, f"merged, {setting}")] = row | server_timings(log.read_text())
    return rows


def server_timings(log: str) -> dict:
    """llama.cpp's own timings summed over a server log's requests: prompt tokens processed and tokens
    decoded a second, and which build served (`"llama.cpp"` of its first line)."""
    sums = {"prompt": [0.0, 0], "eval": [0.0, 0]}
    for kind, ms, tokens in re.findall(r"(prompt eval|\beval) time =\s*([\d.]+) ms /\s*(\d+) tokens", log):
        total = sums[kind.split()[0]]
        total[0] += float(ms)
        total[1] += int(tokens)
    serving = next((json.loads(x) for x in log.splitlines() if x.startswith('{"serving"')), {})
    return {
        "build": serving.get("llama.cpp"),
        "prompt_tokens_per_s": sums["prompt"][1] / (sums["prompt"][0] / 1000) if sums["prompt"][0] else None,
        "decode_tokens_per_s": sums["eval"][1] / (sums["eval"][0] / 1000) if sums["eval"][0] else None,
    }


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
    """The rows beside the first; llama.cpp's own timings where its log had them."""
    first = next(iter(rows.values()))

    def rate(value) -> str:
        return "" if value is None else f"{value:.1f}"

    lines = [
        "| backend | windows/s | output tokens/s | speed vs first row | parse | schema-valid | cut at budget "
        "| memory F1 | F1 vs first row | prompt tokens/s | decoded tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in rows.items():
        lines.append(
            f"| {name} | {m['windows_per_s']:.3f} | {m['output_tokens_per_s']:.1f} | "
            f"{m['windows_per_s'] / first['windows_per_s']:.2f}x | {m['parse_rate']:.3f} | "
            f"{m['schema_valid_rate']:.3f} | {m['truncation_rate']:.3f} | {m['memory_f1']:.3f} | "
            f"{m['memory_f1'] - first['memory_f1']:+.3f} | {rate(m.get('prompt_tokens_per_s'))} | "
            f"{rate(m.get('decode_tokens_per_s'))} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
