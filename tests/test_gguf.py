"""The extractor on a laptop: a merged export as GGUF files (f16, q8_0, q4_k_m) with an Ollama Modelfile,
served by llama.cpp (xllamacpp) behind an OpenAI-compatible endpoint under each window's JSON Schema, and
a real open-weight LLM labeling windows through the datagen stage on that server."""

import json
import socket

import gguf
import gguf.quants
import numpy as np
import pytest
import yaml

from dimmem.contract.tokens import render_prompt
from dimmem.launch import free_port
from dimmem.llamacpp import LlamaCppError, llamacpp_service, resolve_model, server_params
from dimmem.paths import CONFIG_DIR, shared_data
from train.gguf_export import GgufExportError, _llama_cpp_quantize, _more_bits, modelfile, parse_types

# ---- unit ------------------------------------------------------------------------------------------------


def test_types_come_in_order_of_preference_and_a_typo_is_refused():
    assert parse_types("Q4_K_M, f16,q8_0,f16") == ["q8_0", "f16", "q4_k_m"]
    for bad in ("q5_k", "", "f16,q3"):
        with pytest.raises(GgufExportError, match="choose from q8_0, f16, q4_k_m"):
            parse_types(bad)


def test_q4_k_m_gives_more_bits_to_llama_cpps_layers():
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third between."""
    assert [i for i in range(24) if _more_bits(i, 24)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]
    assert [i for i in range(2) if _more_bits(i, 2)] == [1]  # a 2-layer model: its last


def test_k_quants_go_through_llama_cpps_kernel_and_read_back():
    """Q4_K and Q6_K, which gguf-py cannot write, come from ggml_quantize_chunk; gguf-py's reader gets the
    matrix back within each type's error, Q6_K closer than Q4_K."""
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    errors = {}
    with _llama_cpp_quantize():
        for name in ("Q4_K", "Q6_K"):
            qtype = gguf.GGMLQuantizationType[name]
            packed = gguf.quants.quantize(x, qtype)
            assert packed.dtype == np.uint8 and packed.shape == (
                3,
                512 // 256 * gguf.GGML_QUANT_SIZES[qtype][1],
            )
            errors[name] = float(np.abs(gguf.quants.dequantize(packed, qtype) - x).mean())
    assert errors["Q6_K"] < errors["Q4_K"] < 0.1
    with pytest.raises(NotImplementedError):  # restored afterwards: gguf-py alone cannot write Q4_K
        gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_K)


def test_modelfile_lays_out_the_prompt_as_the_chat_template(qwen3_tokenizer):
    """Ollama's template, filled with a system and a user message, is the very prompt the model trained on
    (Qwen3 with thinking off); it stops at the end of the turn and decodes greedily."""
    text = modelfile("model-q8_0.gguf", qwen3_tokenizer, 4096)
    assert text.startswith("FROM ./model-q8_0.gguf\n")
    assert 'PARAMETER stop "<|im_end|>"' in text and "PARAMETER temperature 0" in text
    assert "PARAMETER num_ctx 4096" in text
    template = text.split('TEMPLATE """')[1].split('"""')[0]
    system, user = "Extract memories.", "t1 Ann: I moved to Oslo."
    filled = template.replace("{{ .System }}", system).replace("{{ .Prompt }}", user)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    assert filled == render_prompt(qwen3_tokenizer, messages)
    assert filled.endswith("<think>\n\n</think>\n\n")


def test_gguf_needs_merged_weights(tmp_path):
    from train.export import export

    with pytest.raises(
        ValueError, match="--gguf without --merge writes the adapter as a GGUF LoRA: --gguf f16"
    ):
        export(tmp_path / "run", tmp_path / "out", gguf=["q8_0"])
    assert not (tmp_path / "out").exists()


def test_an_architecture_the_converter_lacks_is_one_line(tmp_path):
    from train.gguf_export import write_gguf

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(
        GgufExportError, match="converter has no NoSuchForCausalLM; serve this export with vLLM"
    ):
        write_gguf(tmp_path, ["q8_0"], {})


def test_llama_cpp_is_refused_what_it_cannot_serve_in_one_line(tmp_path):
    with pytest.raises(LlamaCppError, match="no such GGUF file or export folder"):
        resolve_model(tmp_path / "missing")
    with pytest.raises(LlamaCppError, match="no dimmem_export.json"):
        resolve_model(tmp_path)
    (tmp_path / "dimmem_export.json").write_text('{"merged": tr')  # a copy cut short
    with pytest.raises(LlamaCppError, match="dimmem_export.json: not valid JSON"):
        resolve_model(tmp_path)
    (tmp_path / "dimmem_export.json").write_text(json.dumps({"merged": True, "run": "runs/x"}))
    with pytest.raises(LlamaCppError, match="--merge --gguf q8_0"):
        resolve_model(tmp_path)
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(LlamaCppError, match="notes.gguf: not a readable GGUF file"):
        resolve_model(text)
    with pytest.raises(LlamaCppError, match="--quant picks a file of an export folder"):
        resolve_model(text, "q8_0")


def test_a_busy_port_is_said_before_the_model_loads(tmp_path, capsys):
    from serve.cli import main as serve

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        model = tmp_path / "m.gguf"
        model.write_bytes(b"")  # never read: the port is checked first
        assert serve(["llamacpp", "--model", str(model), "--port", str(port)]) == 2
    assert f"127.0.0.1:{port} is in use; pick another --port" in capsys.readouterr().err


# ---- the tiny model and a real teacher (integration) -------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_export(tiny_exports, tmp_path_factory):
    """The demo's tiny run exported merged with all three GGUF types."""
    from train.export import main as export_run

    out = tmp_path_factory.mktemp("gguf") / "export"
    run = str(tiny_exports["run"])
    assert export_run(["--run", run, "--out", str(out), "--merge", "--gguf", "q4_k_m,f16,q8_0"]) == 0
    return out


@pytest.mark.integration
@pytest.mark.slow
def test_the_export_writes_gguf_files_that_carry_their_settings(gguf_export, tmp_path):
    meta = json.loads((gguf_export / "dimmem_export.json").read_text())
    assert meta["gguf"] == {"q8_0": "model-q8_0.gguf", "f16": "model-f16.gguf", "q4_k_m": "model-q4_k_m.gguf"}
    assert not list(gguf_export.glob("*.partial"))
    sizes = {k: (gguf_export / name).stat().st_size for k, name in meta["gguf"].items()}
    assert sizes["q4_k_m"] < sizes["q8_0"] < sizes["f16"]
    path, settings = resolve_model(gguf_export)  # the export's first choice, its settings from the file
    assert path.name == "model-q8_0.gguf"
    assert settings == {
        "max_model_len": meta["max_model_len"],
        "chat_template_kwargs": {"enable_thinking": False},
        "checkpoint": None,
    }
    reader = gguf.GGUFReader(gguf_export / "model-q4_k_m.gguf")
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    # the tiny model's 128-wide rows are no whole 256-value super-block: llama.cpp's fallback types
    assert types["output.weight"] == "Q8_0" and types["blk.0.attn_q.weight"] == "Q5_0"
    assert types["blk.0.attn_norm.weight"] == "F32"
    params = server_params(path, settings, port=9, parallel=2)
    assert params.n_ctx == 2 * meta["max_model_len"] and params.default_template_kwargs == {
        "enable_thinking": "false"
    }
    assert (gguf_export / "Modelfile").read_text().startswith("FROM ./model-q8_0.gguf\n")
    card = (gguf_export / "README.md").read_text()
    assert "## llama.cpp and Ollama" in card and "dimmem serve llamacpp --model model-q8_0.gguf" in card
    cut = tmp_path / "cut.gguf"  # an interrupted download: one line, before llama.cpp sees it
    cut.write_bytes((gguf_export / "model-q8_0.gguf").read_bytes()[:200_000])
    with pytest.raises(LlamaCppError, match="cut.gguf: (truncated|not a readable GGUF)"):
        resolve_model(cut)


@pytest.mark.integration
@pytest.mark.slow
def test_a_failed_conversion_leaves_the_safetensors_export_whole(tiny_exports, tmp_path, monkeypatch, capsys):
    """A GGUF that fails (here: a full disk while writing) costs the GGUF files only: the merged export
    and its dimmem_export.json are complete, and the command says what failed."""
    import train.export
    import train.gguf_export

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train.gguf_export, "write_gguf", full_disk)
    out = tmp_path / "export"
    assert (
        train.export.main(["--run", str(tiny_exports["run"]), "--out", str(out), "--merge", "--gguf", "q8_0"])
        == 2
    )
    assert "No space left on device" in capsys.readouterr().err
    meta = json.loads((out / "dimmem_export.json").read_text())
    assert meta["merged"] and "gguf" not in meta and (out / "model.safetensors").is_file()


@pytest.mark.integration
@pytest.mark.slow
def test_llama_cpp_serves_the_tiny_export_as_the_hf_path_extracts(gguf_export, tiny_exports, tmp_path):
    """12 held-out toy windows through `dimmem eval extraction`: llama.cpp on q8_0 under each window's JSON
    Schema, and transformers on the merged weights. Every answer that ends parses and meets the schema, and
    memory F1 is no more than 0.02 below the HF path's."""
    from eval.cli import main as evaluate

    common = ["extraction", "--references", f"{tiny_exports['data']}:test", "--limit", "12"]
    common += ["--max-tokens", "768"]
    assert evaluate([*common, "--hf-model", str(gguf_export), "--out", str(tmp_path / "hf")]) == 0
    port = free_port()
    with llamacpp_service(tmp_path / "llamacpp.log", gguf_export, port, quant="q8_0"):
        url = f"http://127.0.0.1:{port}/v1"
        args = ["--base-url", url, "--model", "dimmem-extractor", "--out", str(tmp_path / "llamacpp")]
        assert evaluate([*common, *args]) == 0
    hf, served = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("hf", "llamacpp"))
    assert served["windows"] == hf["windows"] == 12 and served["memories_predicted"] > 0
    assert served["parse_rate"] == served["schema_valid_rate"] == 1.0 - served["truncation_rate"]
    assert served["truncation_rate"] <= 1 / 3
    # Greedy decoding under the grammar and without it part on some windows (more so for a tiny model, whose
    # top tokens lie close), so the served answers are held to "no worse", not to "the same": a broken
    # conversion or template scores near zero.
    assert served["memory_f1"] >= hf["memory_f1"] - 0.02, (served["memory_f1"], hf["memory_f1"])


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_llm_labels_locomo_windows_through_llama_cpp(tmp_path):
    """Qwen2.5-Coder-0.5B-Instruct (the student's base, a GGUF file from PyPI chunk packages) as the datagen
    teacher on llama.cpp: each answer is held to the window's schema by the grammar, every labeled window
    passes the validator, and what it got wrong is quarantined with the validator's reason, not kept."""
    from data_gen.config import DatagenConfig
    from data_gen.run import run as datagen
    from dimmem.gguf_file import assemble_parts

    spec = yaml.safe_load((CONFIG_DIR / "train" / "qwen25-coder-0.5b-locomo.yaml").read_text())["gguf_base"]
    teacher = assemble_parts(spec["parts"], tmp_path / spec["file"], spec.get("sha256"))
    config = yaml.safe_load((CONFIG_DIR / "datagen" / "locomo-local-teacher.yaml").read_text())
    port = free_port()
    config["source"]["input"] = str(shared_data("locomo/locomo10.json"))
    config["source"]["include"] = ["conv-26"]
    config["windows"]["tokenizer"] = str(shared_data("qwen3-tokenizer"))
    config.update(out=str(tmp_path / "labels"), limit=2)
    config["teacher"].update(base_url=f"http://127.0.0.1:{port}/v1", max_tokens=384, max_tokens_cap=384)
    with llamacpp_service(tmp_path / "teacher.log", teacher, port, name="teacher", ctx=6144):
        report = datagen(DatagenConfig.model_validate(config), show_progress=False)
    labels = [json.loads(line) for line in (tmp_path / "labels" / "labels.jsonl").open()]
    quarantined = [json.loads(line) for line in (tmp_path / "labels" / "quarantine.jsonl").open()]
    assert len(labels) + len(quarantined) == 2, report
    assert all(q["reason"] for q in quarantined)
    assert all(row["status"] == "labeled" for row in labels)
    for row in labels:  # the validator let these through: speakers of the window, turns it cites
        for memory in row["value"]["memories"]:
            assert memory["speaker"] in ("Caroline", "Melanie") and memory["source_turns"]


# ---- a LoRA adapter as GGUF, applied by llama.cpp over its base --------------------------------------------


def _tiny_qwen2_with_adapter(root, tokenizer=None):
    """A random 2-layer Qwen2 (the students' architecture) and a LoRA adapter over every projection whose B
    is not zero, saved as a PEFT adapter; the base and the merged model as folders."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer) if tokenizer is not None else 256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(root / "base")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    for name, weight in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(weight, std=0.05)
    peft.save_pretrained(root / "adapter")
    peft.merge_and_unload().save_pretrained(root / "merged")
    if tokenizer is not None:
        for folder in ("base", "merged"):
            tokenizer.save_pretrained(root / folder)


def test_a_lora_adapter_becomes_the_gguf_lora_llama_cpp_reads(tmp_path):
    """Each adapted weight's A and B under its llama.cpp name, in ggml's order (A: inputs x rank, B: rank
    x outputs), in f16, with the adapter's alpha and the base's architecture."""
    from train.gguf_export import write_lora_gguf

    _tiny_qwen2_with_adapter(tmp_path)
    out = write_lora_gguf(tmp_path / "adapter", tmp_path / "base", tmp_path / "adapter.gguf")
    reader = gguf.GGUFReader(out)
    fields = {
        k: reader.get_field(k).contents() for k in ("general.type", "adapter.type", "adapter.lora.alpha")
    }
    assert fields == {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 8.0}
    assert reader.get_field("general.architecture").contents() == "qwen2"
    tensors = {t.name: (t.shape.tolist(), t.tensor_type.name) for t in reader.tensors}
    assert len(tensors) == 2 * 7 * 2  # A and B of seven projections in two layers
    assert tensors["blk.0.ffn_down.weight.lora_a"] == ([256, 4], "F16")
    assert tensors["blk.1.attn_q.weight.lora_b"] == ([4, 128], "F16")
    assert tensors["blk.1.attn_k.weight.lora_b"] == ([4, 64], "F16")  # one key head of 64
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.integration
@pytest.mark.slow
def test_llama_cpp_applies_the_gguf_lora_as_the_merged_weights_answer(tmp_path, qwen3_tokenizer, monkeypatch):
    """The base GGUF with the adapter GGUF over it decodes, greedily, exactly what the merged model's GGUF
    decodes, and not what the base alone does: folded in by `--lora` (the default) and applied at run
    time (`--no-merge`) alike."""
    import urllib.request

    monkeypatch.setenv("DIMMEM_CACHE", str(tmp_path / "cache"))  # where the folded-in copy is kept

    from train.gguf_export import write_gguf, write_lora_gguf

    _tiny_qwen2_with_adapter(tmp_path, qwen3_tokenizer)
    for folder in ("base", "merged"):
        write_gguf(tmp_path / folder, ["f16"], {})
    adapter = write_lora_gguf(tmp_path / "adapter", tmp_path / "base", tmp_path / "adapter.gguf")

    def greedy(model, **lora) -> str:
        port = free_port()
        with llamacpp_service(tmp_path / f"{model.parent.name}.log", model, port, threads=1, ctx=512, **lora):
            body = json.dumps({"prompt": "My name is Ann and I", "max_tokens": 16, "temperature": 0}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions", body, {"Content-Type": "application/json"}
            )
            return json.loads(urllib.request.urlopen(request).read())["choices"][0]["text"]

    base = tmp_path / "base" / "model-f16.gguf"
    merged = greedy(tmp_path / "merged" / "model-f16.gguf")
    assert greedy(base, lora=adapter) == greedy(base, lora=adapter, no_merge=True) == merged != greedy(base)
    assert len(list((tmp_path / "cache" / "gguf" / "merged").glob("*/*.gguf"))) == 1


def test_an_adapter_for_another_model_is_refused_in_one_line(tmp_path):
    from dimmem.llamacpp import check_adapter
    from train.gguf_export import write_lora_gguf

    _tiny_qwen2_with_adapter(tmp_path)
    adapter = write_lora_gguf(tmp_path / "adapter", tmp_path / "base", tmp_path / "adapter.gguf")

    def model(arch: str):
        path = tmp_path / f"{arch}.gguf"
        writer = gguf.GGUFWriter(path, arch)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        return path

    assert check_adapter(adapter, model("qwen2")) == adapter
    with pytest.raises(LlamaCppError, match="an adapter for 'qwen2', not for .*llama.gguf's 'llama'"):
        check_adapter(adapter, model("llama"))
    with pytest.raises(LlamaCppError, match="qwen2.gguf: not a LoRA adapter GGUF"):
        check_adapter(model("qwen2"), model("qwen2"))


def _tiny_base_and_adapter(root, alpha: float = 8.0, seed: int = 0):
    """A two-weight 'qwen2' GGUF (attn_q in Q5_0, attn_k in F16, a norm in F32) and a rank-4 GGUF LoRA
    over both weights; (base, adapter, {weight: (base values, alpha/r·B·A)})."""
    rng = np.random.default_rng(seed)
    q5, f16 = gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.F16
    weights = {"blk.0.attn_q.weight": (64, q5), "blk.0.attn_k.weight": (32, f16)}
    base, adapter = root / "base.gguf", root / "adapter.gguf"
    writer = gguf.GGUFWriter(base, "qwen2")
    writer.add_string("general.name", "tiny")
    writer.add_uint32("qwen2.block_count", 1)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    lora = gguf.GGUFWriter(adapter, "qwen2")
    lora.add_type(gguf.GGUFType.ADAPTER)
    lora.add_string(gguf.Keys.Adapter.TYPE, "lora")
    lora.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    truth = {}
    for name, (rows, kind) in weights.items():
        w = rng.normal(size=(rows, 128)).astype(np.float32)  # (outputs, inputs), as the reader gives it
        stored = gguf.quants.quantize(w, kind)
        writer.add_tensor(name, stored, raw_dtype=kind)
        a = rng.normal(size=(4, 128)).astype(np.float16)  # ggml: inputs x rank
        b = rng.normal(size=(rows, 4)).astype(np.float16)  # ggml: rank x outputs
        lora.add_tensor(f"{name}.lora_a", a)
        lora.add_tensor(f"{name}.lora_b", b)
        delta = alpha / 4 * (b.astype(np.float32) @ a.astype(np.float32))
        truth[name] = (gguf.quants.dequantize(stored, kind), delta)
    writer.add_tensor("blk.0.attn_norm.weight", rng.normal(size=128).astype(np.float32))
    for w in (writer, lora):
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return base, adapter, truth


def test_a_lora_folds_into_the_weights_it_adapts(tmp_path):
    """Each adapted weight becomes W + alpha/r·B·A (what llama.cpp adds at run time): a float weight stays
    in its float type, a 5-bit one becomes Q8_0; every other tensor and every metadata field is copied as
    it was, and nothing half written is left."""
    from dimmem.gguf_file import merge_lora, open_gguf

    base, adapter, truth = _tiny_base_and_adapter(tmp_path)
    merged = open_gguf(merge_lora(base, adapter, tmp_path / "merged.gguf"))
    tensors = {t.name: t for t in merged.tensors}
    q, k = tensors["blk.0.attn_q.weight"], tensors["blk.0.attn_k.weight"]
    assert (q.tensor_type.name, k.tensor_type.name) == ("Q8_0", "F16")
    for t, tolerance in ((q, 1 / 127), (k, 1e-3)):  # Q8_0: a step of 1/127 of a block's largest value
        weight, delta = truth[t.name]
        expected = weight + delta
        got = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.abs(got - expected).max() <= tolerance * np.abs(expected).max()
        assert np.abs(got - weight).max() > 10 * tolerance * np.abs(expected).max()  # the delta is there
    original = {t.name: t for t in open_gguf(base).tensors}
    assert np.array_equal(tensors["blk.0.attn_norm.weight"].data, original["blk.0.attn_norm.weight"].data)
    for key in ("general.architecture", "general.name", "qwen2.block_count", "tokenizer.ggml.tokens"):
        assert merged.get_field(key).contents() == open_gguf(base).get_field(key).contents()
    assert not list(tmp_path.glob("*.partial"))


def test_a_merge_that_fails_leaves_no_half_written_file(tmp_path, monkeypatch):
    """A full disk midway: the error goes up as it is, and neither the file nor a part of it is left."""
    from dimmem.gguf_file import merge_lora

    base, adapter, _ = _tiny_base_and_adapter(tmp_path)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        merge_lora(base, adapter, tmp_path / "merged.gguf")
    assert not list(tmp_path.glob("merged.gguf*"))


def test_a_merged_model_is_built_once_per_model_and_adapter(tmp_path, monkeypatch):
    """`--lora` is served folded in: the merge is kept in the cache and reused; another adapter (or the
    model changed on disk) is another merge."""
    import dimmem.llamacpp as llamacpp

    monkeypatch.setenv("DIMMEM_CACHE", str(tmp_path / "cache"))
    base, adapter, _ = _tiny_base_and_adapter(tmp_path)
    merges = []
    merge = llamacpp.merge_lora
    monkeypatch.setattr(llamacpp, "merge_lora", lambda *args: merges.append(args) or merge(*args))
    first = llamacpp.merged_model(base, adapter)
    assert llamacpp.merged_model(base, adapter) == first and len(merges) == 1
    other = tmp_path / "other"
    other.mkdir()
    _, second_adapter, _ = _tiny_base_and_adapter(other, alpha=16.0)
    assert llamacpp.merged_model(base, second_adapter) != first and len(merges) == 2
    first.write_bytes(first.read_bytes()[:100])  # a cut file is built again
    assert llamacpp.merged_model(base, adapter) == first and len(merges) == 3
    assert first.stat().st_size > 100
