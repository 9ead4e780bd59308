"""How fast the inspector opens a large datagen output: generate one (the toy world labeled by its oracle
through the real datagen run, extraction windows only), then time its first open (the index datagen
wrote beside jobs.jsonl), the first request for the window list after the server starts, warm requests,
a filtered list, the last page and one window; and, for an output written without that index, the scan
that builds one and a later start that finds it cached.

    python -m benchmarks.inspector [--windows 100000] [--out runs/bench/inspect-100k]   (`make bench-inspect`)

The output folder is generated once and reused; the scanned index is rebuilt cold in a fresh folder each
run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

WINDOWS_PER_CONVERSATION = 5.9  # toy world, 4 sessions of 4 stories, window 12, overlap 3


def generate(out: Path, windows: int) -> dict:
    """A datagen output of exactly `windows` extraction windows (reused when it is already there)."""
    report = out / "report.json"
    if report.is_file() and json.loads(report.read_text())["windows"] == windows:
        return json.loads(report.read_text())
    from data_gen.config import DatagenConfig
    from data_gen.run import run

    conversations = int(windows / WINDOWS_PER_CONVERSATION * 1.05) + 1
    config = {
        "source": {"format": "toy", "seed": 0, "conversations": conversations, "sessions": 4},
        "out": str(out),
        "windows": {"window": 12, "overlap": 3, "max_tokens": None},
        "teacher": {"kind": "oracle", "concurrency": 256},
        "tasks": {"extract": True, "parse_query": False, "consolidate": False},
        "limit": windows,
    }
    return run(DatagenConfig.model_validate(config), show_progress=True)


def timed(get, path: str, marker: str = 'id="jobs"') -> float:
    """Seconds for one request, checked to be the page asked for (not an error page)."""
    started = time.perf_counter()
    response = get(path)
    seconds = time.perf_counter() - started
    if response.status_code != 200 or marker not in response.text:
        raise RuntimeError(f"{path}: HTTP {response.status_code}")
    return seconds


def measure(out: Path, repeats: int) -> dict:
    import httpx2

    import inspector.app  # noqa: F401 - imported before the clock starts: the index is what is timed
    from data_gen.jobs_index import INDEX, JOBS
    from devtools.browser import served
    from inspector.cli import open_all
    from inspector.config import InspectConfig

    with (
        tempfile.TemporaryDirectory() as index_dir,
        tempfile.TemporaryDirectory(dir=out.parent) as older,
    ):
        config = InspectConfig(index_dir=index_dir, port=0)
        started = time.perf_counter()
        sources = open_all([str(out)], config)  # the first open of a fresh output: datagen's index
        open_s = time.perf_counter() - started
        if sources[0].jobs.file != out / INDEX:
            raise RuntimeError(f"{out} has no {INDEX} matching {JOBS}: generate it again")
        for name in ("report.json", JOBS):  # the same output as written before datagen wrote its index
            os.link(out / name, Path(older, name))
        started = time.perf_counter()
        open_all([older], config)  # one scan into index_dir
        scan_s = time.perf_counter() - started
        started = time.perf_counter()
        open_all([older], config)  # a later start: the scanned index, cached
        rescan_s = time.perf_counter() - started
        jobs = sources[0].jobs.count()
        conversation = sources[0].jobs.page(None, "line", 1, jobs // 2)[0]["conv"]  # one mid-file
        last = -(-jobs // config.page_size)
        with served(sources, config) as base, httpx2.Client(base_url=base, timeout=60) as client:
            first_s = timed(client.get, "/s/0/jobs")
            warm = [timed(client.get, "/s/0/jobs") for _ in range(repeats)]
            filtered = [
                timed(client.get, f"/s/0/jobs?status=labeled&conversation={conversation}")
                for _ in range(repeats)
            ]
            deep = [timed(client.get, f"/s/0/jobs?page={last}") for _ in range(repeats)]
            window = [
                timed(client.get, f"/s/0/job?id={conversation}/w0001", 'id="turns"') for _ in range(repeats)
            ]
    size_mb = (out / "jobs.jsonl").stat().st_size / 1e6
    return {
        "windows": jobs,
        "jobs_jsonl_mb": round(size_mb, 1),
        "open_s": round(open_s, 3),
        "first_list_s": round(first_s, 3),
        "warm_list_median_s": round(statistics.median(warm), 4),
        "filtered_list_median_s": round(statistics.median(filtered), 4),
        "last_page_median_s": round(statistics.median(deep), 4),
        "window_median_s": round(statistics.median(window), 4),
        "no_index_scan_s": round(scan_s, 2),
        "no_index_cached_s": round(rescan_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=100_000)
    parser.add_argument("--out", default="runs/bench/inspect-100k", help="the generated datagen output")
    parser.add_argument("--repeats", type=int, default=20, help="warm requests timed per page")
    parser.add_argument("--json", default="runs/bench/inspect.json", help="results written here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    report = generate(Path(args.out), args.windows)
    print(f"datagen output: {report['windows']} windows ({time.perf_counter() - started:.0f} s)")
    results = measure(Path(args.out), args.repeats)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    for key, value in results.items():
        print(f"{key:24} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
