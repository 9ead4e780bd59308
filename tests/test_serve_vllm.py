"""Serving exported extractors with vLLM: the command's flags from dimmem_export.json; and with vLLM for
CPU (.venv-vllm) the command checked by vLLM's own parser, the tiny model served merged and as base +
LoRA adapter under structured outputs, and the memory service in front of it."""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
import yaml

from dimmem.launch import Service, free_port
from dimmem.paths import CONFIG_DIR, shared_data
from serve.vllm import VLLM_PYTHON, VLLM_READY, lora_rank, vllm_command, vllm_service

# `make test` sets DIMMEM_REQUIRE_VLLM after building .venv-vllm: there a missing vLLM fails, never skips
needs_vllm = pytest.mark.skipif(
    not VLLM_READY and not os.environ.get("DIMMEM_REQUIRE_VLLM"),
    reason="needs .venv-vllm (`make serve-cpu`); `make test` builds it",
)


def export(folder, merged: bool, modules_to_save=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dimmem_export.json").write_text(
        json.dumps(
            {
                "base_model": "Qwen/Qwen3-4B",
                "merged": merged,
                "max_model_len": 8192,
                "lora_r": 12,
                "chat_template_kwargs": {"enable_thinking": False},
            }
        )
    )
    if not merged:
        (folder / "adapter_config.json").write_text(json.dumps({"r": 12, "modules_to_save": modules_to_save}))
    return folder


def flag(command, name):
    return command[command.index(name) + 1]


def test_merged_export_is_served_under_the_extractor_name_with_training_settings(tmp_path):
    command = vllm_command(model=str(export(tmp_path / "merged", merged=True)), port=8011)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and flag(command, "--port") == "8011"
    assert json.loads(flag(command, "--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert json.loads(flag(command, "--structured-outputs-config")) == {
        "backend": "xgrammar",
        "disable_any_whitespace": True,  # compact answers: no padding with spaces until the budget
    }
    assert flag(command, "--max-model-len") == "8192" and "--enable-prefix-caching" in command
    assert flag(command, "--served-model-name") == "dimmem-extractor" and "--enable-lora" not in command


def test_adapter_export_is_served_as_lora_over_its_base(tmp_path):
    adapter = export(tmp_path / "adapter", merged=False)
    command = vllm_command(adapter=str(adapter))
    assert (
        flag(command, "--model") == "Qwen/Qwen3-4B"
        and flag(command, "--served-model-name") == "dimmem-extractor-base"
    )
    assert (
        flag(command, "--lora-modules") == f"dimmem-extractor={adapter}"
        and flag(command, "--max-lora-rank") == "16"
    )
    assert flag(vllm_command(base="local/base", adapter=str(adapter)), "--model") == "local/base"
    assert lora_rank(8) == 8 and lora_rank(65) == 128


def test_mismatched_exports_are_refused_with_the_right_command(tmp_path):
    with pytest.raises(ValueError, match="--base Qwen/Qwen3-4B --adapter"):
        vllm_command(model=str(export(tmp_path / "a", merged=False)))
    with pytest.raises(ValueError, match="serve it with --model"):
        vllm_command(adapter=str(export(tmp_path / "m", merged=True)))
    with pytest.raises(FileNotFoundError, match="dimmem_export.json"):
        vllm_command(model=str(tmp_path))
    with pytest.raises(ValueError, match="either a merged export"):
        vllm_command()
    with pytest.raises(ValueError, match=r"\['embed_tokens', 'lm_head'\].*export the run with --merge"):
        vllm_command(
            adapter=str(export(tmp_path / "full", merged=False, modules_to_save=["embed_tokens", "lm_head"]))
        )


@pytest.mark.integration
@needs_vllm
def test_vllm_accepts_the_command(tmp_path):
    for command in (
        vllm_command(model=str(export(tmp_path / "m", merged=True))),
        vllm_command(adapter=str(export(tmp_path / "a", merged=False))),
    ):
        check = (
            "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
            "from vllm.entrypoints.launchers.cli_args import make_arg_parser; "
            "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:]); "
            "print(a.default_chat_template_kwargs, a.enable_prefix_caching, a.max_model_len)"
        )
        out = subprocess.run(
            [str(VLLM_PYTHON), "-c", check, *command[3:]], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split()[:3] == ["{'enable_thinking':", "False}", "True"]


# ---- the served extractor on vLLM for CPU (integration: `make test` builds .venv-vllm) -----------------


# what the served tiny model must extract on 12 held-out toy windows (see the test that uses them)
VALID_RATE_FLOOR = 0.75
MEMORY_F1_FLOOR = {"merged": 0.15, "adapter": 0.10}


@pytest.fixture(scope="module", params=["merged", "adapter"])
def served(request, tiny_exports, tmp_path_factory):
    """vLLM serving the merged export, then the adapter over its base (pytest runs one at a time)."""
    kind = request.param
    port = free_port()
    log = tmp_path_factory.mktemp(f"vllm-{kind}") / "vllm.log"
    with vllm_service(
        log, port=port, **{"model" if kind == "merged" else "adapter": str(tiny_exports[kind])}
    ):
        yield kind, f"http://127.0.0.1:{port}/v1"


def http(method: str, url: str, key: str | None = None, body: dict | None = None) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(
        url, json.dumps(body).encode() if body is not None else None, headers, method=method
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            status, raw = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read().decode()
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw


@pytest.mark.integration
@pytest.mark.slow
@needs_vllm
def test_served_extractor_is_schema_valid_under_structured_outputs(served, tiny_exports, tmp_path):
    """A batch of held-out windows through `dimmem eval extraction` against the server: every answer that
    ends parses and meets the strict schema, few are cut off; an adapter's answers are not its base's."""
    from eval.cli import main as evaluate

    kind, url = served
    models = {m["id"] for m in http("GET", f"{url}/models")[1]["data"]}
    assert "dimmem-extractor" in models and (kind == "merged" or "dimmem-extractor-base" in models)
    runs = {}
    for model in ["dimmem-extractor"] + (["dimmem-extractor-base"] if kind == "adapter" else []):
        runs[model] = out = tmp_path / model
        assert (
            evaluate(
                [
                    "extraction",
                    "--references",
                    f"{tiny_exports['data']}:test",
                    "--base-url",
                    url,
                    "--model",
                    model,
                    "--max-tokens",
                    "768",
                    "--limit",
                    "12",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
    metrics = json.loads((runs["dimmem-extractor"] / "metrics.json").read_text())
    assert metrics["windows"] == 12 and metrics["memories_predicted"] > 0
    assert metrics["parse_rate"] == metrics["schema_valid_rate"] == 1.0 - metrics["truncation_rate"]
    # Structured outputs guarantee the line above whatever the weights (compact JSON: no answer pads
    # itself with spaces); the rest are floors on what the model did. A model that loops on one record
    # still runs into the budget: the adapter below (see the next lines) did in 3 windows of 12.
    assert metrics["truncation_rate"] <= 1 / 3
    # BENCHMARKS.md ("The served extractor"), same recipe, per-window schema, 12 windows:
    # valid 0.917, memory F1 0.308 (36 windows: 0.944 / 0.242). An untrained tiny model, or one that ignores
    # the prompt, finds next to no reference memory (F1 near 0). The adapter is 8 steps of a fresh LoRA at
    # a constant 2e-3 over the merged export, which costs some of what the export learned (one run: F1
    # 0.140 against its base's 0.180 on these windows), so its floor is lower, still far above an
    # untrained model's.
    assert metrics["valid_rate"] >= VALID_RATE_FLOOR, metrics["rule_violation_rate"]
    assert metrics["memory_f1"] >= MEMORY_F1_FLOOR[kind], (
        metrics["memories_predicted"],
        metrics["memories_matched"],
    )
    if kind == "adapter":
        answers = [
            [json.loads(line)["output"] for line in (runs[m] / "predictions.jsonl").open()] for m in runs
        ]
        assert answers[0] != answers[1]


@pytest.mark.integration
@pytest.mark.slow
@needs_vllm
def test_served_model_spoken_to_in_the_authors_format(served, tiny_exports, tmp_path):
    """`extractor_format: dimmem-paper` against vLLM: their line layout and their JSON Schema with integer
    message numbers, which xgrammar accepts. The tiny model learned this project's JSON, not their format:
    its answers under their grammar seldom end within the budget (and with whitespace allowed, it pads
    with spaces right after the first `source_id`), so what is checked is what the grammar enforces in
    every answer, ended or not: each `source_id` is a new message of the window and a `source_speaker`,
    where one was reached, that message's speaker; an answer that ends parses and passes the pointer
    rules. Then the runtime by configs/memory/dimmem-4b.yaml."""
    import re

    from dimmem.contract.formats import extract_format
    from dimmem.runtime import Memory
    from eval.cli import main as evaluate
    from eval.extraction import attach_windows, load_references

    kind, url = served
    if kind != "merged":
        pytest.skip("the format is the client's: one served model shows it")
    out, references = tmp_path / "paper", f"{tiny_exports['data']}:test"
    args = ["extraction", "--references", references, "--base-url", url, "--model", "dimmem-extractor"]
    args += ["--extractor-format", "dimmem-paper", "--max-tokens", "96", "--limit", "4", "--out", str(out)]
    assert evaluate(args) == 0
    paper = extract_format("dimmem-paper")
    windows = {r.window_id: r.window for r in attach_windows(load_references(references, 4), references)}
    scored = {w["window_id"]: w for w in map(json.loads, (out / "windows.jsonl").open())}
    cited = 0
    for p in map(json.loads, (out / "predictions.jsonl").open()):
        schema = paper.response_format(windows[p["window_id"]])["json_schema"]["schema"]
        allowed = {
            v["properties"]["source_speaker"]["enum"][0]: v["properties"]["source_id"]["enum"]
            for v in schema["properties"]["memories"]["items"]["anyOf"]
        }
        new_messages = {n for ids in allowed.values() for n in ids}
        for n in re.findall(r'"source_id"\s*:\s*(\d+)', p["raw"]):
            assert int(n) in new_messages, (n, allowed)
            cited += 1
        for n, speaker in re.findall(
            r'"source_id"\s*:\s*(\d+)\s*,\s*"source_speaker"\s*:\s*"([^"]*)"', p["raw"]
        ):
            assert int(n) in allowed[speaker], (n, speaker, allowed)
        w = scored[p["window_id"]]
        if not w["truncated"]:
            assert w["parsed"] and w["schema_valid"], w["rules"]
            assert not {"source_turns_unknown", "source_turns_overlap", "speaker_mismatch"} & set(w["rules"])
    assert cited, "no answer got as far as a source_id"

    config = yaml.safe_load((CONFIG_DIR / "memory" / "dimmem-4b.yaml").read_text())
    config["model"].update(base_url=url, model="dimmem-extractor", max_tokens=96, max_tokens_cap=96)
    config.update(store=str(tmp_path / "m.sqlite"), windows={"window": 4, "overlap": 1, "max_tokens": None})
    texts = [
        "I adopted a beagle called Biscuit.",
        "Lovely!",
        "I run every Sunday.",
        "Nice.",
        "I moved to Oslo.",
    ]
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": t, "created_at": "2024-05-02"} for i, t in enumerate(texts)]
    memory = Memory(config)
    try:
        result = memory.add(messages, user_id="ann", conversation_id="chat")
        stored = memory.store.records("ann")
    finally:
        memory.close()
    assert result.windows == 2  # each window asked in their format; an answer cut off costs only itself
    assert all("cut off" in reason for reason in result.failed.values()), result.failed
    pointer_rules = ("source_turns_unknown", "source_turns_overlap", "speaker_mismatch")
    assert not [r for r in result.rejected if any(rule in r for rule in pointer_rules)]
    assert all(set(r["source_turns"]) <= {f"S1:{n}" for n in range(1, 6)} for r in stored)


@pytest.mark.integration
@pytest.mark.slow
@needs_vllm
def test_memory_service_over_the_served_extractor(served, tiny_exports, tmp_path):
    """`dimmem serve api` with configs/memory/served-tiny.yaml pointed at the server: a new conversation
    is added, a stored memory is found by search, the other tenant sees none of it."""
    from devtools.serve_demo import CONVERSATION_INDEX, toy_messages

    _, url = served
    memory = yaml.safe_load((CONFIG_DIR / "memory" / "served-tiny.yaml").read_text())
    memory["model"]["base_url"] = url
    memory["windows"]["tokenizer"] = str(tiny_exports["merged"])
    (tmp_path / "memory.yaml").write_text(yaml.safe_dump(memory))
    port = free_port()
    (tmp_path / "serve.yaml").write_text(
        yaml.safe_dump(
            {
                "memory_config": str(tmp_path / "memory.yaml"),
                "store": str(tmp_path / "memory.sqlite"),
                "port": port,
                "tenants": [
                    {"name": "a", "api_key_env": "TENANT_A_KEY"},
                    {"name": "b", "api_key_env": "TENANT_B_KEY"},
                ],
            }
        )
    )
    api = f"http://127.0.0.1:{port}"
    with Service(
        [sys.executable, "-m", "serve", "api", "--config", str(tmp_path / "serve.yaml")],
        f"{api}/healthz",
        tmp_path / "api.log",
        env={"TENANT_A_KEY": "key-a", "TENANT_B_KEY": "key-b"},
        startup_timeout=120,
    ):
        messages, _ = toy_messages(CONVERSATION_INDEX)
        status, added = http("POST", f"{api}/v1/memories", "key-a", {"user_id": "ann", "messages": messages})
        assert status == 200 and added["failed"] == {} and added["windows"] == 6
        # stored as itself (a merged record lives on in its target), and not replaced by a later one
        replaced = {e["target"] for e in added["events"]}
        stored = [
            e["id"]
            for e in added["events"]
            if e["action"] in ("KEEP_BOTH", "SUPERSEDE") and e["id"] not in replaced
        ]
        assert stored, added
        record_path = f"{api}/v1/memories/{quote(stored[0], safe='')}?user_id=ann"
        status, record = http("GET", record_path, "key-a")
        assert (
            status == 200
            and record["status"] == "active"
            and record["conversation_id"] == added["conversation_id"]
        )
        status, found = http(
            "POST", f"{api}/v1/search", "key-a", {"user_id": "ann", "query": record["content"], "k": 10}
        )
        assert status == 200 and stored[0] in [hit["record"]["id"] for hit in found["hits"]]
        assert (
            http("POST", f"{api}/v1/search", "key-b", {"user_id": "ann", "query": record["content"]})[1][
                "hits"
            ]
            == []
        )
        assert http("GET", record_path, "key-b")[0] == 404
        assert http("POST", f"{api}/v1/search", "wrong", {"user_id": "ann", "query": "x"})[0] == 401


@pytest.mark.integration
@pytest.mark.slow
@needs_vllm
def test_memory_qa_against_vllm_reports_a_judge_that_gives_no_verdict(served, tmp_path):
    """`dimmem eval qa` with the served tiny model as answerer and judge. The model was trained only to
    extract, so its grades are rarely CORRECT or WRONG: every question ends with a verdict or a counted
    judge failure, asked twice, and the prompt tokens are vLLM's own count."""
    from dimmem.cli import main

    _, url = served
    one = tmp_path / "one.json"
    one.write_text(json.dumps(json.loads(shared_data("locomo/locomo10.json").read_text())[:1]))
    args = ["eval", "qa", "--benchmark", "locomo", "--input", str(one), "--limit", "3", "--k", "3"]
    for role in ("answer", "judge"):
        args += [f"--{role}-base-url", url, f"--{role}-model", "dimmem-extractor"]
    assert main([*args, "--judge-max-tokens", "64", "--out", str(tmp_path / "qa")]) == 0
    metrics = json.loads((tmp_path / "qa" / "metrics.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "qa" / "answers.jsonl").open()]
    assert metrics["questions"] == len(rows) == 3 and metrics["judge_max_tokens"] == 64
    for row in rows:
        assert row["judge_failed"] == (row["judgment"] not in ("CORRECT", "WRONG"))
        assert len(row["judge_replies"]) in ((2,) if row["judge_failed"] else (1, 2))
        assert row["answer_prompt_tokens"] > 0  # vLLM's usage, not an estimate
    assert metrics["judge_failures"] == sum(r["judge_failed"] for r in rows)
    assert metrics["judge_failure_rate"] == pytest.approx(metrics["judge_failures"] / 3)
