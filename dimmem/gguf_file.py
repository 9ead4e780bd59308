"""Opening a GGUF file (the `gguf` package's reader) with one clear error for a foreign or cut file, which
would otherwise fail deep inside numpy's memmap or inside llama.cpp."""

from __future__ import annotations

from pathlib import Path


def open_gguf(path: Path):
    """The file's GGUFReader; ValueError naming the file when it is not GGUF or its tensors run past its end
    (an interrupted download or copy)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # numpy's memmap or the header parser, on a foreign or truncated file
        raise ValueError(f"{path}: not a readable GGUF file ({exc})") from None
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise ValueError(f"{path}: truncated ({path.stat().st_size} bytes, its tensors end at byte {end})")
    return reader
