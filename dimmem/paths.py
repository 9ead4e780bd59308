"""Where the project and the shared data live.

Datasets and the tokenizer are never copied into the project: they are read from
`<repo root>/../shared/data`, or from `$DIMMEM_SHARED_DATA` when set.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"
EXPORT_CONFIG = "dimmem_export.json"  # beside an export's weights: how it was trained and must be served
RUN_CONFIG = "dimmem_train.json"  # a training run's record (train.sft), kept beside an adapter export
LORA_GGUF = "adapter.gguf"  # an adapter export's GGUF LoRA (`--gguf f16`, no --merge): a student runs it
CHECKSUMS = "SHA256SUMS"  # every file of an export and its sha256
GGUF_SETTINGS_KEY = "dimmem.export"  # the same serving settings (JSON) inside each GGUF file of an export


def cache_dir() -> Path:
    """Where what is built once lives (the embedder's ONNX export, fitted thresholds, the shipped
    student's base): `$DIMMEM_CACHE`, else ~/.cache/dimmem."""
    return Path(os.environ.get("DIMMEM_CACHE") or Path.home() / ".cache" / "dimmem")


def built_once(path: Path, key: str, build: Callable[[Path], object]) -> Path:
    """`path`, made by `build(path)` unless an earlier build of the same `key` left it whole (a stamp beside
    it, written last, holds the key and the file's size). Processes starting at once build it once: the
    others wait on a lock beside it, then find it built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built(path, key):
            return path
        build(path)
        path.with_name(path.name + ".built").write_text(f"{key} {path.stat().st_size}\n")
    return path


def is_built(path: Path, key: str) -> bool:
    """Whether a build of `key` by `built_once` left `path` whole."""
    stamp = path.with_name(path.name + ".built")
    whole = [key, str(path.stat().st_size)] if path.is_file() else None
    return stamp.is_file() and stamp.read_text().rsplit(None, 1) == whole  # (a key may hold spaces)


def read_export_config(folder: str | Path) -> dict:
    """An export folder's `dimmem_export.json` (FileNotFoundError: the folder is not an export;
    ValueError: the file is not a JSON object), the one reader for every command that serves, converts
    or benchmarks an export."""
    missing = f"not an export folder (no {EXPORT_CONFIG}; `dimmem export` writes it)"
    return _json_object(folder, EXPORT_CONFIG, missing, "; export the run again")


def read_run_config(folder: str | Path) -> dict:
    """A run's or adapter export's `dimmem_train.json` (FileNotFoundError: there is none; ValueError: it
    is not a JSON object), the one reader for export and the runtime's student."""
    return _json_object(folder, RUN_CONFIG, f"not a training run (no {RUN_CONFIG}; dimmem train writes it)")


def _json_object(folder: str | Path, name: str, missing: str, advice: str = "") -> dict:
    """`folder/name` read as a JSON object, or one error naming the folder or file."""
    path = Path(folder) / name
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: {missing}")
    try:
        found = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}){advice}") from None
    if not isinstance(found, dict):
        raise ValueError(f"{path}: not a JSON object{advice}")
    return found


def shared_data_dir() -> Path:
    return Path(os.environ.get("DIMMEM_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")


def shared_data(relative: str) -> Path:
    """A path under the shared data folder, with a clear error when it is missing."""
    path = shared_data_dir() / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found. Shared data is read from <repo>/../shared/data; "
            "set DIMMEM_SHARED_DATA to point elsewhere."
        )
    return path


def write_json(path: str | Path, obj) -> Path:
    """Results as indented JSON, the folder created if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2) + "\n")
    return path


def dataset_folder(path: str | Path) -> Path:
    """The saved Hugging Face DatasetDict of a datagen output folder (`OUT/dataset`), or `path` itself
    when it is one; FileNotFoundError naming the folder otherwise."""
    path = Path(path)
    for folder in (path / "dataset", path):
        if (folder / "dataset_dict.json").is_file():
            return folder
    raise FileNotFoundError(
        f"{path}: not a datagen output (no dataset_dict.json here or in {path / 'dataset'})"
    )
