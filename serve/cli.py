"""`dimmem serve ...` / `python -m serve ...`: the HTTP memory service."""
from __future__ import annotations

import argparse
import sys

from dimmem.paths import CONFIG_DIR


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="serve_command", required=True)
    api = sub.add_parser("api", help="the HTTP memory service (FastAPI + uvicorn) over the runtime")
    api.add_argument("--config", default=str(CONFIG_DIR / "serve" / "default.yaml"))
    api.add_argument("--host")
    api.add_argument("--port", type=int)
    api.add_argument("--openapi", metavar="FILE", help="write the OpenAPI document to FILE and exit")


def run_cli(args: argparse.Namespace) -> int:
    import json

    import uvicorn

    from serve.api import create_app
    from serve.config import load_serve_config

    config = load_serve_config(args.config, host=args.host, port=args.port)
    if args.openapi:
        from serve.openapi import write_openapi

        write_openapi(args.openapi)
        return 0
    app = create_app(config)
    print(json.dumps({"listening": f"http://{config.host}:{config.port}", "tenants": [t.name for t in config.tenants]}))
    uvicorn.run(app, host=config.host, port=config.port, log_level="info")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve", description=__doc__)
    add_arguments(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
