"""llama.cpp's OpenAI-compatible server for a GGUF extractor, on the CPU of a laptop (`xllamacpp`: the
server compiled into a Python wheel, so nothing builds on install; or the same release compiled for this
CPU by `make llamacpp-native`, which is then loaded instead: `llamacpp_native`).

    dimmem serve llamacpp --model runs/demo/export-tiny              # an export written with --gguf
    dimmem serve llamacpp --model teacher.gguf --ctx 8192 --port 8080
    dimmem serve llamacpp --model base.gguf --lora adapter.gguf     # a base and a LoRA adapter over it

It is one more OpenAI-compatible endpoint: the memory service (`extractor.base_url`), `dimmem eval
extraction --base-url` and the datagen teacher (`teacher.base_url`) use it as they use vLLM. Each request's
`response_format` (the window's JSON Schema, which ModelClient always sends) becomes a grammar inside
llama.cpp, so every answer that ends parses. Settings of an export come from its dimmem_export.json:
thinking off through the chat template's arguments, the context length it trained with. The runtime
starts the same server as a child process (`python -m dimmem.llamacpp`) for the shipped student.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from dimmem import llamacpp_native
from dimmem.gguf_file import file_sha256, merge_lora, open_gguf
from dimmem.launch import Service, port_in_use
from dimmem.paths import EXPORT_CONFIG, GGUF_SETTINGS_KEY, built_once, cache_dir, read_export_config

SERVED_NAME = "dimmem-extractor"
INT32_MAX = 2**31 - 1  # llama.cpp's counts (context, slots, threads) are C ints
SETTINGS_TYPES = {"max_model_len": int, "chat_template_kwargs": dict}  # what serving reads of the settings


class LlamaCppError(ValueError):
    """A model llama.cpp cannot be pointed at: the message says what was found and what to run."""


def resolve_model(model: str | Path, quant: str | None = None) -> tuple[Path, dict]:
    """The GGUF file to serve and its serving settings: `model` is a .gguf file, or an export folder
    whose dimmem_export.json lists its GGUF files (`dimmem export --gguf`). The settings are the ones
    the file carries (an export's); a GGUF file from elsewhere has none and gets llama.cpp's defaults."""
    path = Path(model)
    if path.is_file():
        if quant:
            raise LlamaCppError(f"{path}: --quant picks a file of an export folder, not of a GGUF file")
        return path, gguf_settings(path)
    if not path.is_dir():
        raise LlamaCppError(f"{path}: no such GGUF file or export folder")
    try:
        meta = read_export_config(path)
    except FileNotFoundError as exc:
        raise LlamaCppError(f"{exc}; serve an export folder or a .gguf file") from None
    except ValueError as exc:
        raise LlamaCppError(str(exc)) from None
    files = meta.get("gguf") or {}
    if not files:
        raise LlamaCppError(
            f"{path}: an export without GGUF files; write them with "
            f"`dimmem export --run {meta.get('run', 'RUN')} --out {path} --merge --gguf q8_0`"
        )
    if quant is not None and quant not in files:
        raise LlamaCppError(f"{path}: no {quant} file; it has {', '.join(sorted(files))}")
    chosen = quant or next(iter(files))  # the export lists its files in order of preference
    gguf = path / files[chosen]
    if not gguf.is_file():
        raise LlamaCppError(f"{gguf}: listed in {path / EXPORT_CONFIG} but missing; export it again")
    return gguf, gguf_settings(gguf)


def gguf_settings(path: Path) -> dict:
    """The `dimmem export` settings inside a GGUF file ({} for one written elsewhere), after checking
    that the file is whole: a truncated download fails here in one line, not inside llama.cpp."""
    from gguf import GGUFValueType

    try:
        reader = open_gguf(path)
    except ValueError as exc:
        raise LlamaCppError(str(exc)) from None
    field = reader.get_field(GGUF_SETTINGS_KEY)
    if field is None:
        return {}
    try:
        settings = json.loads(field.contents()) if field.types == [GGUFValueType.STRING] else None
    except json.JSONDecodeError:
        settings = None
    if not isinstance(settings, dict) or any(
        settings.get(key) is not None and not isinstance(settings[key], kind)
        for key, kind in SETTINGS_TYPES.items()
    ):
        raise LlamaCppError(
            f"{path}: metadata field {GGUF_SETTINGS_KEY!r} is not the JSON object of settings "
            f"`dimmem export` writes ({', '.join(SETTINGS_TYPES)}); export the model again"
        )
    return settings


def server_params(
    gguf: Path,
    meta: dict,
    host: str = "127.0.0.1",
    port: int = 8080,
    name: str = SERVED_NAME,
    ctx: int | None = None,
    threads: int | None = None,
    parallel: int = 1,
    api_key: str | None = None,
    lora: Path | None = None,
    draft: str = "none",
):
    """xllamacpp's CommonParams: greedy decoding, the export's chat template arguments and context, a
    LoRA adapter over the model when one is given, and `draft`: speculative decoding with tokens drafted
    from n-grams of the context (`DRAFTS`; a record copies names, dates and phrases from its window's
    turns, which the model then checks many at once; greedy, but a batch computes in another order than
    one token alone, so a near tie can go the other way)."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    if lora is not None:
        params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(str(lora), 1.0)]
    if draft != "none":
        kind = getattr(xllamacpp.common_speculative_type, DRAFTS[draft])
        params.speculative.types = [kind]
    params.model_alias = {name}
    params.hostnames = [host]
    params.port = port
    params.n_parallel = parallel
    # the server divides its context among the slots: each request gets the whole trained length
    per_request = ctx or meta.get("max_model_len") or 4096
    if per_request * parallel > INT32_MAX:
        raise LlamaCppError(
            f"--parallel {parallel} requests of {per_request} tokens each: more context than llama.cpp "
            f"holds ({INT32_MAX} tokens); lower --ctx or --parallel"
        )
    params.n_ctx = per_request * parallel
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads or os.cpu_count() or 1
    params.use_jinja = True  # the GGUF's own chat template, with its arguments (thinking off)
    params.default_template_kwargs = {
        k: json.dumps(v) for k, v in (meta.get("chat_template_kwargs") or {}).items()
    }
    params.sampling.temp = 0.0
    if api_key:
        params.api_keys = [api_key]
    return params


# --draft: llama.cpp's n-gram speculative types (no draft model: the drafts come from the context itself)
DRAFTS = {
    "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
    "ngram-map-k": "COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K",
    "ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
    "ngram-cache": "COMMON_SPECULATIVE_TYPE_NGRAM_CACHE",
}


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`; anything else is a usage error naming the flag
    (exit status 2), not a failure deep inside the server."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: an integer from {low} to {high}")
        return value

    return parse


port_number = int_between(1, 65535)  # (0, "any free port", would leave clients no address to call)


def add_arguments(parser) -> None:
    count = int_between(1, INT32_MAX)
    parser.add_argument("--model", required=True, help="a .gguf file, or an export folder with GGUF files")
    parser.add_argument("--lora", help="a LoRA adapter as GGUF (adapter.gguf) to apply over the model")
    parser.add_argument(
        "--no-merge",
        action="store_true",
        help="apply --lora at run time; by default the model is served with the adapter folded into its "
        "weights (built once, cached; Q8_0 where the model's blocks are coarser), which decodes faster",
    )
    parser.add_argument("--quant", help="which of the export's GGUF files (f16, q8_0, q4_k_m; default q8_0)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8080)
    parser.add_argument("--name", default=SERVED_NAME, help="the model name clients ask for")
    parser.add_argument(
        "--ctx", type=count, help="context per request (default: the export's trained length)"
    )
    parser.add_argument("--threads", type=count, help="CPU threads (default: all cores)")
    parser.add_argument("--parallel", type=count, default=1, help="requests decoded together (slots)")
    parser.add_argument(
        "--draft",
        choices=["none", *DRAFTS],
        default="none",
        help="speculative decoding drafted from n-grams of the context (no draft model); slower than none "
        "on 2 CPU cores (BENCHMARKS.md), and a token checked in a batch may break a near tie otherwise",
    )
    parser.add_argument(
        "--portable",
        action="store_true",
        help="the wheel's llama.cpp (built for any x86-64) even where one compiled for this CPU is present "
        "(`make llamacpp-native`), which is used by default",
    )
    parser.add_argument("--api-key-env", help="require the key in this environment variable")
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the process that started this one is gone"
    )


def run_llamacpp(args) -> int:
    """Serve until SIGTERM or Ctrl-C."""
    llamacpp_native.select(portable=args.portable)  # before xllamacpp is imported
    import xllamacpp

    if port_in_use(args.port, args.host):
        raise LlamaCppError(f"{args.host}:{args.port} is in use; pick another --port")
    gguf, meta = resolve_model(args.model, args.quant)
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise LlamaCppError(f"--api-key-env {args.api_key_env}: the variable is not set or empty")
    lora = check_adapter(Path(args.lora), gguf) if args.lora else None
    if lora is not None and not args.no_merge:
        try:
            gguf, lora = merged_model(gguf, lora), None
        except OSError as exc:  # a full disk, say: slower, but served
            print(
                f"could not fold {lora.name} into {gguf.name} ({exc}); applying it at run time",
                file=sys.stderr,
            )
    params = server_params(
        gguf,
        meta,
        args.host,
        args.port,
        args.name,
        args.ctx,
        args.threads,
        args.parallel,
        key,
        lora,
        args.draft,
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = xllamacpp.Server(params)  # loads the model, then listens
    except RuntimeError as exc:  # llama.cpp logged why (memory, architecture, context) above
        raise LlamaCppError(f"{gguf}: llama.cpp could not start ({exc}); its log above says why") from None
    url, build = f"{server.listening_address}/v1", llamacpp_native.which(xllamacpp)
    print(json.dumps({"serving": str(gguf), "name": args.name, "url": url, "llama.cpp": build}))
    sys.stdout.flush()
    parent = os.getppid()
    while not stop.wait(1.0):
        if args.exit_with_parent and os.getppid() != parent:  # orphaned: the parent was killed
            break
    return 0


def merged_model(model: Path, lora: Path) -> Path:
    """`model` with the LoRA `lora` folded into its weights (`gguf_file.merge_lora`), built once per pair of
    files and kept in the dimmem cache: llama.cpp decodes it faster on a CPU than the model with the
    adapter applied at run time (BENCHMARKS.md), and answers as it does but for rounding."""
    stat = model.stat()
    key = hashlib.sha256(f"{model.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{file_sha256(lora)}".encode())

    def merge(path: Path) -> None:
        # stderr: the child's stdout carries the line that says where it serves
        print(f"folding {lora.name} into {model.name} (once; kept in {path.parent})", file=sys.stderr)
        merge_lora(model, lora, path)

    return built_once(
        cache_dir() / "gguf" / "merged" / key.hexdigest()[:16] / f"{model.stem}+lora.gguf",
        key.hexdigest(),
        merge,
    )


def check_adapter(path: Path, model: Path) -> Path:
    """A LoRA adapter GGUF for the model's architecture, or one line saying what it is instead."""
    try:
        reader = open_gguf(path)
    except ValueError as exc:
        raise LlamaCppError(str(exc)) from None

    def text(key: str) -> str | None:
        field = reader.get_field(key)
        return field.contents() if field is not None else None

    if text("general.type") != "adapter" or text("adapter.type") != "lora":
        raise LlamaCppError(f"{path}: not a LoRA adapter GGUF (general.type {text('general.type')!r})")
    base = open_gguf(model).get_field("general.architecture")
    if base is not None and text("general.architecture") != base.contents():
        raise LlamaCppError(
            f"{path}: an adapter for {text('general.architecture')!r}, not for {model}'s {base.contents()!r}"
        )
    return path


def main(argv: list[str] | None = None) -> int:
    """`python -m dimmem.llamacpp`: the server alone, as the runtime starts it for the shipped student."""
    import argparse

    from dimmem.errors import run_command

    parser = argparse.ArgumentParser(prog="python -m dimmem.llamacpp", description=__doc__)
    add_arguments(parser)
    return run_command("llamacpp", run_llamacpp, parser.parse_args(argv))


def llamacpp_service(
    log: str | Path, model: str | Path, port: int, startup_timeout: float = 300.0, **flags
) -> Service:
    """The llama.cpp server as a `with` block (a child process); ready once /v1/models answers."""
    command = [sys.executable, "-m", "dimmem.llamacpp", "--model", str(model), "--port", str(port)]
    for flag, value in flags.items():
        if value is True:
            command.append(f"--{flag.replace('_', '-')}")
        elif value not in (None, False):
            command += [f"--{flag.replace('_', '-')}", str(value)]
    return Service(
        command, f"http://127.0.0.1:{port}/v1/models", log, startup_timeout=startup_timeout, name="llama.cpp"
    )


if __name__ == "__main__":
    raise SystemExit(main())
