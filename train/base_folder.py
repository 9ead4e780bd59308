"""A base model written once as a `save_pretrained` folder beside the spec it was built from: training
reuses a folder whose spec matches its config and rebuilds any other (train/tiny.py, train/gguf_base.py)."""

from __future__ import annotations

import json
from pathlib import Path


def write_base(out: Path, model, tokenizer, spec_file: str, spec: dict) -> Path:
    """Save `model` and `tokenizer` to `out`, then `spec` as `spec_file`: written last, so a run killed while
    saving leaves no spec and the next one rebuilds the folder."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / spec_file).write_text(json.dumps(spec, indent=2) + "\n")
    return out


def matches(out: str | Path, spec_file: str, spec: dict) -> bool:
    """Whether `out` holds a base built from this very spec (every key given has the value given)."""
    path = Path(out) / spec_file
    if not path.exists():
        return False
    saved = json.loads(path.read_text())
    return all(saved.get(k) == v for k, v in spec.items())
