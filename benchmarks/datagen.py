"""Labeling throughput against a local OpenAI-compatible server with a fixed latency.

Starts `devtools.fake_teacher` in its own process, then labels the same toy windows at each concurrency
with a fresh store (nothing cached) through the real client, validator and store, and prints windows/s
next to the ideal min(concurrency, windows) / latency.

    python -m benchmarks.datagen --latency 2.0 --concurrency 1,8,64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import psutil

from data_gen.config import DatagenConfig
from data_gen.jobs import extract_jobs
from data_gen.labeler import Labeler, label_all
from data_gen.run import load_source
from data_gen.store import JobStore
from data_gen.teacher import ModelTeacher
from devtools.fake_teacher import FakeTeacherProcess
from dimmem.cache import ResponseCache
from dimmem.llm import ModelClient


def measure(cfg: DatagenConfig, warmup, jobs, concurrency: int) -> float:
    """Seconds to label `jobs` at `concurrency`, from an empty store, after `warmup` jobs have opened the
    client's connections (steady state, as in a long run)."""
    cfg = cfg.model_copy(update={"teacher": cfg.teacher.model_copy(update={"concurrency": concurrency})})
    with tempfile.TemporaryDirectory() as tmp:
        cache, jobs_store = ResponseCache(Path(tmp) / "cache.sqlite"), JobStore(Path(tmp) / "cache.sqlite")
        client = ModelClient(cfg.teacher, cache=cache)
        labeler = Labeler(ModelTeacher(client), jobs_store, cfg.teacher)

        async def go():
            await label_all(labeler, warmup, concurrency)
            start = time.perf_counter()
            outcomes = await label_all(labeler, jobs, concurrency)
            elapsed = time.perf_counter() - start
            await client.async_client.close()
            return outcomes, elapsed

        outcomes, elapsed = asyncio.run(go())
        jobs_store.close()
        cache.close()
    assert all(o.status == "labeled" for o in outcomes), "benchmark windows must all label cleanly"
    assert client.usage.cache_hits == 0, "benchmark windows must all be distinct requests"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--latency", type=float, default=2.0, help="server seconds per request (teacher calls take seconds)"
    )
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument(
        "--rounds", type=int, default=5, help="windows per concurrency slot (windows = rounds x concurrency)"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    server = FakeTeacherProcess(args.latency)
    base_url = server.base_url
    try:
        cfg = DatagenConfig.model_validate(
            {
                "source": {
                    "format": "toy",
                    "seed": 0,
                    "conversations": 200,
                    "sessions": 4,
                    "stories_per_session": 4,
                },
                "out": "unused",
                "windows": {"window": 8, "overlap": 2, "max_tokens": None},
                "teacher": {"base_url": base_url, "model": "bench", "timeout": 30},
            }
        )
        conversations, _ = load_source(cfg)
        all_jobs = extract_jobs(conversations, 8, 2, None, None)
        results = []
        print(f"latency {args.latency}s per request; each level labels rounds x concurrency fresh windows")
        print(
            f"{'concurrency':>11} {'windows':>8} {'seconds':>8} {'windows/s':>10} {'ideal':>8} {'ratio':>6}"
        )
        server_cpu, client_cpu = psutil.Process(server.proc.pid), psutil.Process()
        for level in levels:
            warmup, jobs = all_jobs[:level], all_jobs[level : level + args.rounds * level]
            cpu_before = (sum(server_cpu.cpu_times()[:2]), sum(client_cpu.cpu_times()[:2]))
            seconds = measure(cfg, warmup, jobs, level)
            cpu = [
                (sum(p.cpu_times()[:2]) - b) * 1000 / (len(jobs) + len(warmup))
                for p, b in zip((server_cpu, client_cpu), cpu_before)
            ]
            print(f"  cpu ms/request: server {cpu[0]:.1f}, client {cpu[1]:.1f}")
            rate, ideal = len(jobs) / seconds, min(level, len(jobs)) / args.latency
            results.append(
                {
                    "concurrency": level,
                    "windows": len(jobs),
                    "seconds": round(seconds, 3),
                    "windows_per_s": round(rate, 2),
                    "ideal": round(ideal, 2),
                    "ratio": round(rate / ideal, 3),
                }
            )
            print(
                f"{level:>11} {len(jobs):>8} {seconds:>8.2f} {rate:>10.2f} {ideal:>8.2f} {rate / ideal:>6.3f}"
            )
    finally:
        server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"latency": args.latency, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
