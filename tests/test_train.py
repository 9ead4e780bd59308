"""Training: answer-only loss with the real Qwen3 template, data checks, tiny CPU runs (loss falls,
resume, two processes), launch configs, export (merge parity, loading, Hub push)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import pytest
import torch
import yaml

from dimmem.contract.records import canonical_json, memory_record
from dimmem.contract.tokens import render_prompt
from dimmem.paths import CONFIG_DIR, REPO_ROOT, shared_data
from train.args import QWEN3_LINEAR, parse_args
from train.data import DatasetFormatError, mix_tasks, prepare_split, tokenize_row

MESSAGES = [
    {"role": "system", "content": "You extract memories."},
    {"role": "user", "content": "t1 Ann: I adopted a cat named Miso yesterday."},
    {
        "role": "assistant",
        "content": canonical_json(  # the answer as a model is trained to write it
            "extract",
            {
                "memories": [
                    memory_record(
                        source_turns=["t1"],
                        speaker="Ann",
                        content="Ann adopted a cat named Miso on 2024-01-01.",
                        type="episodic",
                        time="2024-01-01",
                        keywords=["Ann", "Miso"],
                    )
                ]
            },
        ),
    },
]


def test_label_mask_token_by_token(qwen3_tokenizer):
    tok = qwen3_tokenizer
    row = tokenize_row(MESSAGES, tok)
    ids, labels = row["input_ids"], row["labels"]
    prompt = render_prompt(tok, MESSAGES[:-1])
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off, as served
    for i, (token, label) in enumerate(zip(ids, labels)):
        if i < n_prompt:
            assert label == -100, f"prompt token {i} ({tok.decode([token])!r}) carries loss"
        else:
            assert label == token, f"answer token {i} ({tok.decode([token])!r}) is masked"
    assert tok.decode(ids[n_prompt:]) == MESSAGES[2]["content"] + "<|im_end|>"
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    # the same tokens as the full rendered conversation: no merge across the prompt/answer boundary
    assert ids == tok(prompt + MESSAGES[2]["content"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
    assert "system" not in tok.decode([t for t, label in zip(ids, labels) if label != -100])


@pytest.mark.parametrize(
    "messages,error",
    [
        (MESSAGES[1:], "roles"),
        (MESSAGES[:2] + [{"role": "assistant", "content": "  "}], "empty assistant answer"),
    ],
)
def test_bad_rows_fail_clearly(qwen3_tokenizer, messages, error):
    with pytest.raises(DatasetFormatError, match=error):
        tokenize_row(messages, qwen3_tokenizer)


def test_overlong_rows_are_an_error_unless_dropped(qwen3_tokenizer):
    from datasets import Dataset

    split = Dataset.from_list([{"messages": MESSAGES, "window_id": "c/w0000"}] * 3)
    with pytest.raises(DatasetFormatError, match=r"3 row\(s\) longer than max_length=20 \(e.g. \['c/w0000'"):
        prepare_split(split, qwen3_tokenizer, 20, False, "train")
    assert len(prepare_split(split, qwen3_tokenizer, 20, True, "train")) == 0
    assert len(prepare_split(split, qwen3_tokenizer, 4096, False, "train")) == 3


def test_task_mixing():
    from datasets import Dataset

    split = Dataset.from_list(
        [{"task": "extract", "i": i} for i in range(10)]
        + [{"task": "consolidate", "i": i} for i in range(10)]
    )
    mixed = mix_tasks(split, {"extract": 2.0, "consolidate": 0.3}, seed=0)
    assert sorted(mixed["task"]).count("extract") == 20 and mixed["task"].count("consolidate") == 3
    with pytest.raises(DatasetFormatError, match="no weight"):
        mix_tasks(split, {"extract": 1.0}, seed=0)


def test_lora_targets_all_seven_projections(tmp_path):
    raw = yaml.safe_load((CONFIG_DIR / "train" / "tiny.yaml").read_text())
    raw.pop("lora_target_modules")
    path = tmp_path / "bare.yaml"
    path.write_text(yaml.safe_dump(raw))
    model_args = parse_args(["--config", str(path)])[2]
    assert model_args.lora_target_modules == QWEN3_LINEAR
    from trl import get_peft_config

    assert set(get_peft_config(model_args).target_modules) == set(QWEN3_LINEAR)


@pytest.mark.parametrize(
    "name,kind",
    [
        ("single_gpu", "single"),
        ("multi_gpu", "ddp"),
        ("deepspeed_zero2", 2),
        ("deepspeed_zero3", 3),
        ("fsdp2", "fsdp"),
    ],
)
def test_launch_configs_load_in_accelerate(name, kind, monkeypatch):
    # Public routes only: accelerate's config loader (a key it does not know raises), then the file's
    # settings as `accelerate launch` flags through its own parser (an unknown flag is an error), then
    # the environment `accelerate launch` gives the processes, from which the plugins build themselves.
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DeepSpeedPlugin, DistributedType, FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    monkeypatch.chdir(REPO_ROOT)
    path = f"configs/accelerate/{name}.yaml"
    config = load_config_from_file(path)
    mode = {
        DistributedType.MULTI_GPU: ["--multi_gpu"],
        DistributedType.DEEPSPEED: ["--use_deepspeed"],
        DistributedType.FSDP: ["--use_fsdp"],
    }.get(config.distributed_type, [])
    flags = [
        *mode,
        "--num_processes",
        str(config.num_processes),
        "--num_machines",
        str(config.num_machines),
        "--mixed_precision",
        config.mixed_precision or "no",
        "--dynamo_backend",
        (config.dynamo_config or {}).get("dynamo_backend", "no"),
    ]
    for section in (config.deepspeed_config or {}), (config.fsdp_config or {}):
        for key, value in section.items():
            flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    args = launch_command_parser().parse_args(["--config_file", path, *flags, "-m", "train"])
    args.deepspeed_fields_from_accelerate_config = (
        list(config.deepspeed_config) if args.use_deepspeed else []
    )  # as `accelerate launch` sets it
    if kind == "single":
        assert not (args.multi_gpu or args.use_deepspeed or args.use_fsdp) and args.num_processes == 1
    elif kind == "ddp":
        assert args.multi_gpu and args.num_processes == 8
    elif kind == "fsdp":
        with patch.dict(os.environ, prepare_multi_gpu_env(args)):
            plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2 and plugin.transformer_cls_names_to_wrap == ["Qwen3DecoderLayer"]
    else:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        with patch.dict(os.environ, prepare_deepspeed_cmd_env(args)[1]):
            plugin = DeepSpeedPlugin()
        assert plugin.zero_stage == kind
        DeepSpeedZeroConfig(
            **{k: v for k, v in plugin.deepspeed_config["zero_optimization"].items() if v != "auto"}
        )
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
        from trl import SFTConfig

        ds = HfTrainerDeepSpeedConfig(str(REPO_ROOT / args.deepspeed_config_file))
        ds.trainer_config_process(
            SFTConfig(
                output_dir="x",
                per_device_train_batch_size=2,
                gradient_accumulation_steps=4,
                bf16=False,
                use_cpu=True,
            )
        )
        assert (
            ds.config["train_micro_batch_size_per_gpu"] == 2 and ds.config["gradient_accumulation_steps"] == 4
        )


# ---- tiny CPU training runs ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A toy dataset from the oracle teacher and a tiny training config pointing at it."""
    from data_gen.config import DatagenConfig
    from data_gen.run import run

    root = tmp_path_factory.mktemp("train")
    run(
        DatagenConfig.model_validate(
            {
                "source": {"format": "toy", "conversations": 12, "sessions": 2, "stories_per_session": 3},
                "out": str(root / "data"),
                "windows": {"window": 10, "overlap": 2, "max_tokens": None},
                "teacher": {"kind": "oracle"},
                "tasks": {"consolidate": False},
            }
        ),
        show_progress=False,
    )
    raw = yaml.safe_load((CONFIG_DIR / "train" / "tiny.yaml").read_text())
    raw.update(
        dataset_path=str(root / "data"),
        model_name_or_path=str(root / "tiny-base"),
        output_dir=str(root / "run"),
        task_weights={"extract": 1.0, "parse_query": 1.0},
        max_steps=24,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        logging_steps=1,
        eval_steps=12,
        save_steps=12,
        eval_on_start=True,
        report_to=["none"],
        warmup_steps=0,
        lora_modules_to_save=["embed_tokens", "lm_head"],
    )
    raw["tiny_base"].update(
        tokenizer=str(shared_data("qwen3-tokenizer")),
        vocab_size=600,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=128,
    )
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(raw))
    return root, config


@pytest.fixture(scope="module")
def tiny_run(tiny_setup):
    from train.__main__ import main

    root, config = tiny_setup
    assert main(["--config", str(config)]) == 0
    return root / "run"


def _state(folder):
    return json.loads((folder / "trainer_state.json").read_text())


@pytest.mark.slow
def test_tiny_training_loss_falls_and_writes_the_run(tiny_run):
    history = _state(tiny_run / "checkpoint-24")["log_history"]
    evals = {h["step"]: h["eval_loss"] for h in history if "eval_loss" in h}
    assert sorted(evals) == [0, 12, 24]
    assert evals[24] < evals[12] < 0.8 * evals[0]  # validation loss on answer tokens falls
    assert len([h for h in history if "loss" in h]) == 24
    for name in (
        "adapter_model.safetensors",
        "adapter_config.json",
        "dimmem_train.json",
        "loss.png",
        "tokenizer.json",
    ):
        assert (tiny_run / name).exists(), name
    adapter = json.loads((tiny_run / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == set(QWEN3_LINEAR) and adapter["r"] == 16
    assert Path(json.loads((tiny_run / "dimmem_train.json").read_text())["base_model"]).is_absolute()


@pytest.mark.slow
def test_tiny_run_reports_its_throughput(tiny_run):
    run = json.loads((tiny_run / "dimmem_train.json").read_text())
    assert run["dimmem"]["answer_only_logits"] is True  # the profile's settings, as trained
    assert run["sft"]["train_sampling_strategy"] == "random" and run["sft"]["padding_free"] is True
    assert run["model"]["attn_implementation"] == "sdpa_varlen"
    t = run["throughput"]
    logged = [h for h in _state(tiny_run / "checkpoint-24")["log_history"] if "loss" in h]
    # TRL counts every step's non-pad tokens; the meter leaves the first (warm-up) step out
    assert t["steps_timed"] == 23
    assert t["real_tokens"] == logged[-1]["num_tokens"] - logged[0]["num_tokens"]
    assert t["real_tokens"] == t["token_slots"] and t["padding_efficiency"] == 1.0  # padding-free batches
    assert t["real_tokens_per_s"] > 0 and t["real_tokens_per_cpu_s"] > 0 and 0 < t["step_s"] < 60
    assert 0.1 < t["peak_memory_gib"] < 24 and t["peak_memory_kind"] == "process peak RSS"
    assert 0 < t["model_tflops_per_token"] < 1e-4 and t["mfu"] is None  # MFU only on a GPU


@pytest.mark.slow
def test_resume_continues_from_the_saved_step(tiny_setup, tiny_run):
    from train.__main__ import main

    root, config = tiny_setup
    assert (
        main(
            [
                "--config",
                str(config),
                "--resume",
                "latest",
                "--max_steps",
                "26",
                "--save_steps",
                "13",
                "--eval_strategy",
                "no",
            ]
        )
        == 0
    )
    history = _state(root / "run" / "checkpoint-26")["log_history"]
    steps = [h["step"] for h in history if "loss" in h]
    assert steps == list(range(1, 27))  # 1-24 restored from checkpoint-24, then 25 and 26
    resumed = [h["loss"] for h in history if "loss" in h and h["step"] > 24]
    assert max(resumed) < 0.8 * history[1]["loss"]  # it went on from the trained adapter, not from scratch


@pytest.mark.slow
def test_a_checkpoint_exports_while_the_run_goes_on(tiny_setup, tmp_path):
    """The run's record is written before training starts: a checkpoint of a run still going (here one
    that died at step 3) exports, and its card names the step exported."""
    from transformers import TrainerCallback

    from train.args import parse_args
    from train.export import main as export_main
    from train.sft import train

    class Dies(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("killed at step 3")

    _, config = tiny_setup
    out = tmp_path / "run"
    argv = ["--config", str(config), "--output_dir", str(out), "--max_steps", "6", "--save_steps", "2"]
    with pytest.raises(RuntimeError, match="killed at step 3"):
        train(*parse_args([*argv, "--eval_strategy", "no"]), callbacks=[Dies()])
    assert json.loads((out / "dimmem_train.json").read_text())["final_step"] is None
    assert (
        export_main(["--run", str(out), "--checkpoint", "2", "--out", str(tmp_path / "ck2"), "--merge"]) == 0
    )
    exported = json.loads((tmp_path / "ck2" / "dimmem_export.json").read_text())
    assert exported["checkpoint"] == 2 and exported["merged"] is True
    assert "| step exported | 2 |" in (tmp_path / "ck2" / "README.md").read_text()


def _fake_checkpoints(run: Path, evals: dict[int, float], steps: list[int]) -> None:
    """checkpoint-N folders with the files a trainer writes, each logging the validation losses so far."""
    for step in steps:
        folder = run / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        for name in ("adapter_config.json", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt"):
            (folder / name).write_text(f"{name} at {step}")
        history = [{"step": s, "eval_loss": loss} for s, loss in evals.items() if s <= step]
        (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))


def test_the_mirror_keeps_the_newest_checkpoint_whole_and_the_best_ones_adapter(tmp_path):
    from train.checkpoints import mirror_run, restore_run
    from train.export import best_checkpoint

    run, mirror = tmp_path / "run", tmp_path / "mirror"
    _fake_checkpoints(run, {20: 0.5, 40: 0.6}, [10, 20, 30, 40, 50])
    assert mirror_run(run, mirror) == ["checkpoint-20", "checkpoint-50"]
    assert sorted(p.name for p in (mirror / "checkpoint-50").iterdir()) == sorted(
        p.name for p in (run / "checkpoint-50").iterdir()
    )
    assert sorted(p.name for p in (mirror / "checkpoint-20").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "trainer_state.json",
    ]
    # a fresh machine: both come back, the best one is still found, a resume takes the newest
    fresh = tmp_path / "fresh"
    assert restore_run(mirror, fresh) == ["checkpoint-20", "checkpoint-50"]
    assert best_checkpoint(fresh) == 20
    # a local checkpoint is never overwritten by the mirror's copy
    (fresh / "checkpoint-50" / "optimizer.pt").write_text("newer, local")
    assert restore_run(mirror, fresh) == []
    assert (fresh / "checkpoint-50" / "optimizer.pt").read_text() == "newer, local"
    # killed between the swap's two renames: the previous mirror is still whole and restores
    mirror.rename(tmp_path / "mirror.previous")
    assert restore_run(mirror, tmp_path / "third") == ["checkpoint-20", "checkpoint-50"]
    # a run with no checkpoint yet leaves the mirror alone
    assert mirror_run(tmp_path / "empty", tmp_path / "other") == [] and not (tmp_path / "other").exists()


@pytest.mark.slow
def test_a_mirrored_run_resumes_on_a_fresh_machine(tiny_setup, tmp_path, capsys):
    """`checkpoint_mirror`: a run killed mid-way whose output folder is then lost (a new machine) goes on
    from the mirrored checkpoint to the same end, and `--checkpoint best` still finds its best adapter."""
    from transformers import TrainerCallback

    from train.args import parse_args
    from train.export import best_checkpoint
    from train.sft import train

    class Dies(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                raise RuntimeError("killed at step 5")

    _, config = tiny_setup
    out, mirror = tmp_path / "run", tmp_path / "kept" / "mirror"
    argv = [
        *("--config", str(config), "--output_dir", str(out), "--checkpoint_mirror", str(mirror)),
        *("--resume", "latest", "--max_steps", "8", "--save_steps", "2", "--eval_steps", "2"),
    ]
    with pytest.raises(RuntimeError, match="killed at step 5"):
        train(*parse_args(argv), callbacks=[Dies()])
    assert {p.name for p in mirror.iterdir()} <= {"checkpoint-2", "checkpoint-4"}
    assert (mirror / "checkpoint-4" / "optimizer.pt").is_file()  # all a resume needs, not the adapter alone
    assert not mirror.with_name("mirror.partial").exists()
    shutil.rmtree(out)  # the machine is gone; the mirror was kept
    train(*parse_args(argv))
    assert "restored checkpoint-4" in capsys.readouterr().err
    history = _state(out / "checkpoint-8")["log_history"]
    assert [h["step"] for h in history if "loss" in h] == list(range(1, 9))  # 1-4 restored, 5-8 trained
    kept = sorted(p.name for p in mirror.iterdir())
    best = best_checkpoint(out)
    assert kept == sorted({"checkpoint-8", f"checkpoint-{best}"})
    if best != 8:  # the best one's adapter alone, and it exports from a fresh copy of the mirror
        assert not (mirror / f"checkpoint-{best}" / "optimizer.pt").exists()
    assert best_checkpoint(mirror) == best


@pytest.mark.slow
@pytest.mark.integration
def test_two_process_cpu_run(tiny_setup, tiny_run):
    root, config = tiny_setup
    out = root / "run-ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "-m",
            "train",
            "--config",
            str(config),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--eval_strategy",
            "no",
            "--save_strategy",
            "no",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((out / "dimmem_train.json").read_text())
    assert run["world_size"] == 2 and run["dimmem"]["answer_only_logits"] is True
    # the second step's tokens of both ranks, in the run's record and in its log
    assert run["throughput"]["steps_timed"] == 1 and run["throughput"]["real_tokens"] > 0
    assert proc.stdout.count("throughput: ") == 1


@pytest.mark.slow
def test_merged_export_matches_base_plus_adapter_and_loads(tiny_setup, tiny_run, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.export import export

    out = export(tiny_run, tmp_path / "merged", checkpoint=24, merge=True)
    tok = AutoTokenizer.from_pretrained(out)
    text = render_prompt(tok, MESSAGES[:-1]) + MESSAGES[2]["content"]
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    base = AutoModelForCausalLM.from_pretrained(
        json.loads((tiny_run / "dimmem_train.json").read_text())["base_model"]
    )
    with torch.no_grad():
        reference = PeftModel.from_pretrained(base, tiny_run / "checkpoint-24").eval()(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(out).eval()(ids).logits
        plain = (
            AutoModelForCausalLM.from_pretrained(
                json.loads((tiny_run / "dimmem_train.json").read_text())["base_model"]
            )
            .eval()(ids)
            .logits
        )
    assert torch.allclose(merged, reference, atol=1e-4)
    assert not torch.allclose(
        merged, plain, atol=1e-4
    )  # the adapter changed something, so parity means something
    assert tok.chat_template == AutoTokenizer.from_pretrained(tiny_run).chat_template
    assert render_prompt(tok, MESSAGES[:-1]) == render_prompt(
        AutoTokenizer.from_pretrained(tiny_run), MESSAGES[:-1]
    )
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["eos_token_id"] == tok.convert_tokens_to_ids("<|im_end|>")
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "base_model: tiny-base" in card
    assert json.loads((out / "dimmem_export.json").read_text())["chat_template_kwargs"] == {
        "enable_thinking": False
    }


@pytest.mark.slow
def test_adapter_export_and_hub_push_intercepted(tiny_run, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    from train.export import export, push

    out = export(tiny_run, tmp_path / "adapter")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "README.md",
            "SHA256SUMS",
            "adapter_config.json",
            "adapter_model.safetensors",
            "chat_template.jinja",
            "dimmem_export.json",
            "dimmem_train.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )
    assert "library_name: peft" in (out / "README.md").read_text()
    calls = []

    def record(name):
        def method(self, *args, **kwargs):
            calls.append((name, args, kwargs))
            if name == "upload_folder":
                kwargs["files"] = sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())
            return f"https://huggingface.co/{args[0] if args else kwargs.get('repo_id')}"

        return method

    for name in ("create_repo", "create_branch", "upload_folder"):
        monkeypatch.setattr(HfApi, name, record(name))
    push(out, "me/dimmem-tiny", private=True, revision="v1")
    (_, create_args, create), (_, _, branch), (_, _, upload) = calls
    assert create_args == ("me/dimmem-tiny",) and create["private"] is True and create["repo_type"] == "model"
    assert branch["branch"] == "v1"
    assert upload["repo_id"] == "me/dimmem-tiny" and upload["revision"] == "v1"
    assert "adapter_model.safetensors" in upload["files"] and "README.md" in upload["files"]


@pytest.mark.slow
def test_cpu_benchmark_runs_its_variants_side_by_side(tiny_setup, tmp_path):
    """Two variants, one step each after a warm-up step, one round: the table has both, in the config's
    order, with the ratios to the first (a single step says nothing about speed or padding)."""
    from benchmarks.train_cpu import main

    root, config = tiny_setup
    bench = tmp_path / "bench.yaml"
    bench.write_text(
        yaml.safe_dump(
            {
                "train": {"max_steps": 2, "eval_strategy": "no", "save_strategy": "no", "report_to": "none"},
                "variants": {
                    "before": {
                        "answer_only_logits": False,
                        "padding_free": False,
                        "attn_implementation": "sdpa",
                    },
                    "after": {"answer_only_logits": True},  # the profile's padding-free batches
                },
            },
            sort_keys=False,  # the first variant is the baseline
        )
    )
    out = tmp_path / "bench.json"
    rows = main(["--profile", str(config), "--bench-config", str(bench), "--rounds", "1", "--json", str(out)])
    assert (
        [r["variant"] for r in rows]
        == ["before", "after"]
        == [r["variant"] for r in json.loads(out.read_text())["variants"]]
    )
    before, after = rows
    assert before["real_tokens_per_s_ratio"] == 1.0 and after["real_tokens_per_s"] > 0
    assert 0 < before["padding_efficiency"] < 1 == after["padding_efficiency"] and after["steps_timed"] == 1
    assert after["padding_efficiency_ratio"] == round(1 / before["padding_efficiency"], 3)


def test_bad_dataset_path_exits_2_with_a_message(tmp_path, capsys):
    from train.__main__ import main

    code = main(
        [
            "--config",
            str(CONFIG_DIR / "train" / "tiny.yaml"),
            "--dataset_path",
            str(tmp_path / "nope"),
            "--model_name_or_path",
            str(tmp_path / "base"),
            "--output_dir",
            str(tmp_path / "run"),
        ]
    )
    assert code == 2 and "not a datagen output" in capsys.readouterr().err


@pytest.mark.slow
def test_an_adapter_export_is_a_run_that_rebuilds_the_merged_model(tiny_run, tmp_path):
    """An adapter export (here in float16, half the size) keeps the run's record and lists every file's
    sha256: `dimmem export --run` takes it again and merges the same model as from the run itself."""
    import hashlib

    from safetensors.torch import load_file

    from train.export import export

    shipped = export(tiny_run, tmp_path / "shipped", checkpoint=24, adapter_dtype="float16")
    assert {w.dtype for w in load_file(shipped / "adapter_model.safetensors").values()} == {torch.float16}
    sums = dict(line.split("  ")[::-1] for line in (shipped / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {p.name for p in shipped.iterdir()} - {"SHA256SUMS"}
    for name, digest in sums.items():
        assert hashlib.sha256((shipped / name).read_bytes()).hexdigest() == digest, name
    assert json.loads((shipped / "dimmem_train.json").read_text())["final_step"] == 24
    card = (shipped / "README.md").read_text()
    assert "## Data and licenses" in card and "The training data's license: generated by" in card
    again = load_file(export(shipped, tmp_path / "again", merge=True) / "model.safetensors")
    direct = load_file(export(tiny_run, tmp_path / "direct", checkpoint=24, merge=True) / "model.safetensors")
    assert again.keys() == direct.keys()
    assert all(torch.allclose(again[k], direct[k], atol=1e-3) for k in direct)
    with pytest.raises(ValueError, match="--adapter-dtype is for an adapter export"):
        export(tiny_run, tmp_path / "x", merge=True, adapter_dtype="float16")


@pytest.mark.slow
def test_an_export_into_a_folder_that_holds_files_needs_overwrite(tiny_run, tmp_path, capsys):
    """`--out` holding files (here an earlier export's) is refused in one line and left as it was; with
    --overwrite it is emptied first, so no earlier file stays and SHA256SUMS lists only the new export."""
    from train.export import main as export_main

    out = tmp_path / "export"
    earlier = [out / "model.safetensors", out / "gguf" / "model-q8_0.gguf"]
    for path in earlier:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"an earlier export")
    argv = ["--run", str(tiny_run), "--out", str(out)]
    assert export_main(argv) == 2
    err = capsys.readouterr().err
    assert f"dimmem export: error: --out {out}: the folder holds files already; pass --overwrite" in err
    assert sorted(out.rglob("*")) == sorted([*earlier, out / "gguf"])

    assert export_main([*argv, "--overwrite"]) == 0
    assert not any(path.exists() for path in earlier) and not (out / "gguf").exists()
    listed = {line.split("  ")[1] for line in (out / "SHA256SUMS").read_text().splitlines()}
    assert listed == {p.name for p in out.iterdir()} - {"SHA256SUMS"}
    assert "adapter_model.safetensors" in listed


def test_the_best_checkpoint_is_the_one_of_lowest_validation_loss(tmp_path):
    from train.export import best_checkpoint

    with pytest.raises(FileNotFoundError, match="holds no checkpoint-N folder"):
        best_checkpoint(tmp_path)
    for step in (20, 40, 60):
        (tmp_path / f"checkpoint-{step}").mkdir()
    log = [{"step": 20, "loss": 1.0}, {"step": 40, "eval_loss": 0.7}, {"step": 60, "eval_loss": 0.8}]
    log.append({"step": 80, "eval_loss": 0.5})  # evaluated, not saved (or removed): not a choice
    (tmp_path / "checkpoint-60" / "trainer_state.json").write_text(json.dumps({"log_history": log}))
    assert best_checkpoint(tmp_path) == 40
    (tmp_path / "checkpoint-60" / "trainer_state.json").write_text(json.dumps({"log_history": log[:1]}))
    with pytest.raises(ValueError, match="no saved checkpoint .* has a validation loss"):
        best_checkpoint(tmp_path)
