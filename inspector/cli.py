"""`dimmem inspect PATH... [--port P]`: serve the local web inspector over datagen outputs, eval runs and
memory stores until Ctrl-C. Large JSONL files are indexed before the server starts (once per file: the
index is cached), so every page afterwards reads only the rows it shows."""

from __future__ import annotations

import argparse
import sys

from dimmem.config import add_set_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    from inspector.config import DEFAULT_CONFIG

    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a datagen output folder, an eval run folder, or a memory store (SQLite file, postgresql://...)",
    )
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="inspector YAML (configs/inspect/)")
    p.add_argument("--port", type=int, help="port to serve on (default 8765)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--page-size", type=int, help="rows per page")
    p.add_argument("--memory-config", help="runtime YAML stores are searched with (configs/memory/)")
    add_set_argument(p, "page_size=100")


def open_all(paths: list[str], config) -> list:
    """Every source, each reported on stderr as it opens (a broken one with its reason)."""
    import time

    from dimmem.runtime.cli import DEFAULT_CONFIG as MEMORY_CONFIG
    from inspector.sources import open_source

    sources = []
    for spec in paths:
        started = time.perf_counter()
        source = open_source(spec, config, config.memory_config or str(MEMORY_CONFIG))
        seconds = time.perf_counter() - started
        if source.kind == "broken":
            print(f"  {spec}: cannot read it: {source.problem}", file=sys.stderr)
        else:
            print(f"  {source.kind:8} {spec}: {source.summary()} ({seconds:.2f} s)", file=sys.stderr)
        sources.append(source)
    return sources


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from dimmem.config import load_config
    from inspector.app import build_app
    from inspector.config import InspectConfig

    config = load_config(
        InspectConfig,
        args.config,
        args.overrides,
        port=args.port,
        host=args.host,
        page_size=args.page_size,
        memory_config=args.memory_config,
    )
    sources = open_all(args.paths, config)
    if config.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"  serving on {config.host}: anyone who can reach it can read these outputs", file=sys.stderr)
    print(
        f"dimmem inspect: http://{config.host}:{config.port}/  (Ctrl-C stops it)", file=sys.stderr, flush=True
    )
    uvicorn.run(build_app(sources, config), host=config.host, port=config.port, log_level="warning")
    return 0
