"""`dimmem serve ...` / `python -m serve ...`: the HTTP memory service, the MCP server, vLLM, llama.cpp."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from dimmem.config import add_set_argument
from dimmem.paths import CONFIG_DIR

if TYPE_CHECKING:
    from serve.config import ServeConfig


STUDENT_HELP = (
    "extract with the shipped student (Qwen2.5-Coder-0.5B + LoRA, llama.cpp on this machine; its base is "
    "assembled from PyPI packages on first use) instead of the memory config's extractor"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dimmem.llamacpp import add_arguments as llamacpp_arguments
    from dimmem.llamacpp import port_number

    sub = parser.add_subparsers(dest="serve_command", required=True, metavar="{api,mcp,vllm,llamacpp}")
    api = sub.add_parser("api", help="the HTTP memory service (FastAPI + uvicorn) over the runtime")
    api.add_argument("--config", default=str(CONFIG_DIR / "serve" / "default.yaml"))
    api.add_argument("--host")
    api.add_argument("--port", type=port_number)
    api.add_argument(
        "--workers", type=int, help="worker processes over one store (default 1; share a Postgres store)"
    )
    api.add_argument("--student", action="store_true", default=None, help=STUDENT_HELP)
    add_set_argument(api, "max_k=50")
    api.add_argument("--openapi", metavar="FILE", help="write the OpenAPI document to FILE and exit")

    mcp = sub.add_parser(
        "mcp", help="the memory tools for MCP clients: stdio (one local user) or streamable HTTP (tenants)"
    )
    mcp.add_argument("--config", default=str(CONFIG_DIR / "serve" / "mcp.yaml"))
    mcp.add_argument("--transport", choices=["stdio", "http"])
    mcp.add_argument("--user", help="the user of tool calls that name none (default: me)")
    mcp.add_argument("--store", help="the store (a SQLite path or postgresql://...); overrides the configs'")
    mcp.add_argument("--host")
    mcp.add_argument("--port", type=port_number)
    mcp.add_argument("--student", action="store_true", default=None, help=STUDENT_HELP)
    add_set_argument(mcp, "max_k=50")
    mcp.set_defaults(serve_handler=run_mcp)

    vllm = sub.add_parser(
        "vllm", help="launch (or --print) vLLM's OpenAI-compatible server for an exported extractor"
    )
    which = vllm.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a merged export folder")
    which.add_argument("--adapter", help="an adapter export folder (with --base)")
    vllm.add_argument("--base", help="the base model of --adapter (default: the one it was trained on)")
    vllm.add_argument(
        "--python", help="the interpreter with vLLM (default: .venv-vllm from `make serve-cpu`, if present)"
    )
    vllm.add_argument("--host", default="127.0.0.1")
    vllm.add_argument("--port", type=port_number, default=8000)
    vllm.add_argument("--max-model-len", type=int, help="default: the length the model was trained with")
    vllm.add_argument(
        "--any-whitespace",
        action="store_true",
        help="let the grammar allow whitespace between JSON tokens (a model trained on spaced JSON)",
    )
    vllm.add_argument("--print", action="store_true", help="print the command instead of running it")
    vllm.add_argument("extra", nargs="*", help="more vLLM flags, after --")
    vllm.set_defaults(serve_handler=run_vllm)

    llamacpp = sub.add_parser(
        "llamacpp", help="serve a GGUF extractor (or teacher) with llama.cpp on CPU, OpenAI-compatible"
    )
    llamacpp_arguments(llamacpp)
    llamacpp.set_defaults(serve_handler=run_llamacpp)
    api.set_defaults(serve_handler=run_api)


def run(args: argparse.Namespace) -> int:
    return args.serve_handler(args)


def run_vllm(args: argparse.Namespace) -> int:
    import os

    from serve.vllm import DEFAULT_PYTHON, VLLM_READY, printable, vllm_command, vllm_env

    python = args.python or DEFAULT_PYTHON
    command = vllm_command(
        args.model,
        args.base,
        args.adapter,
        python=python,
        host=args.host,
        port=args.port,
        compact_json=not args.any_whitespace,
        max_model_len=args.max_model_len,
        extra=args.extra,
    )
    if args.print:
        print(printable(command))
        return 0
    if python == "python" and not VLLM_READY:
        print(
            "note: no .venv-vllm here (`make serve-cpu` builds vLLM for CPU); using `python` from PATH",
            file=sys.stderr,
        )
    os.execvpe(command[0], command, vllm_env())


def run_llamacpp(args: argparse.Namespace) -> int:
    from dimmem.llamacpp import run_llamacpp as serve_gguf

    return serve_gguf(args)


def run_api(args: argparse.Namespace) -> int:
    import json

    if args.openapi:  # the document does not depend on the config
        from serve.openapi import write_openapi

        write_openapi(args.openapi)
        return 0
    from serve.app import build_app
    from serve.config import load_serve_config
    from serve.server import serve

    config = load_serve_config(
        args.config,
        args.overrides,
        host=args.host,
        port=args.port,
        workers=args.workers,
        student=args.student,
    )
    # refuses missing, empty or shared keys and names, naming the variables, before anything starts;
    # with several workers each builds its own app (runtime, embedder, store connections)
    config.keys(), config.operator_key()
    app = build_app(config) if config.workers == 1 else None
    _warn_weak_keys(config)
    tenants = [t.name for t in config.tenants]
    metrics = "operator key" if config.operator_key_env else "off"
    print(
        json.dumps(
            {
                "listening": f"http://{config.host}:{config.port}",
                "tenants": tenants,
                "metrics": metrics,
                "workers": config.workers,
            }
        )
    )
    serve(app, config)
    return 0


def run_mcp(args: argparse.Namespace) -> int:
    import json

    from dimmem.config import load_config
    from serve.config import McpConfig
    from serve.mcp import serve

    config = load_config(
        McpConfig,
        args.config,
        args.overrides,
        transport=args.transport,
        user=args.user,
        store=args.store,
        host=args.host,
        port=args.port,
        student=args.student,
    )
    if config.transport == "http":  # stdout is the protocol's over stdio: nothing else is written there
        config.keys()  # refuses missing, empty or shared keys and names, naming the variables, first
        _warn_weak_keys(config)
        tenants = [t.name for t in config.tenants]
        print(
            json.dumps({"listening": f"http://{config.host}:{config.port}{config.path}", "tenants": tenants})
        )
    serve(config)
    return 0


def _warn_weak_keys(config: ServeConfig) -> None:
    from serve.config import MIN_KEY_CHARS

    for variable in config.weak_keys():
        print(
            f"warning: the API key in {variable} is shorter than {MIN_KEY_CHARS} characters", file=sys.stderr
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError) as exc:  # a bad config or input: say what and where, no traceback
        print(f"serve {args.serve_command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
