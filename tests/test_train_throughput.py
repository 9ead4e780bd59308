"""Training throughput settings: the answer-only output head computes the same loss and gradients as the full
one, packed rows stay apart under the kernels that allow packing (and the rest are refused), the GPU-only
profiles validate and refuse plainly on a CPU, the padding estimate follows the sampler. (The tiny CPU runs,
their throughput report and the CPU benchmark are in test_train.py, with its tiny dataset.)"""

import pytest
import torch
import yaml

from dimmem.paths import CONFIG_DIR
from train.args import parse_args
from train.sft import PACKING_KERNELS, TrainConfigError, check_packing
from train.varlen_attention import NAME as SDPA_VARLEN

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_qwen3(attn: str = "sdpa", vocab: int = 300):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    )
    config._attn_implementation = attn
    return Qwen3ForCausalLM(config)


def batch(vocab: int = 300):
    """Three rows: answers of different lengths, one row right-padded, one row without any answer token."""
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (3, 24))
    attention = torch.ones_like(ids)
    attention[1, 19:] = 0
    labels = ids.clone()
    labels[0, :14] = -100
    labels[1, :10] = -100
    labels[1, 19:] = -100
    labels[2] = -100
    return ids, attention, labels


@pytest.mark.parametrize("modules_to_save", [["lm_head"], None], ids=["head-trained", "head-frozen"])
def test_answer_only_logits_match_the_full_computation(modules_to_save):
    """The PEFT model as SFTTrainer builds it (TRL's fused head added first): loss and every trainable
    gradient (LoRA, and the output layer when it trains) equal the plain forward's, which projects every
    position; the output layer sees the answer positions only."""
    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from train.answer_logits import add_answer_only_head

    base = tiny_qwen3()
    add_fused_lm_head(base, outputs=("log_probs", "entropy", "is_top1"))
    model = get_peft_model(
        base,
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=LORA_TARGETS,
            modules_to_save=modules_to_save,
            init_lora_weights=False,  # B != 0, so the LoRA A gradients are not trivially zero
        ),
    )
    ids, attention, labels = batch()

    def loss_and_grads(**kwargs):
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=attention, labels=labels, use_cache=False, **kwargs)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return out, grads

    full, full_grads = loss_and_grads()  # transformers' own loss over full logits
    add_answer_only_head(base)
    seen = []
    hook = base.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    answer, answer_grads = loss_and_grads(fused_lm_head=True)
    hook.remove()

    n_answer = int((labels[:, 1:] != -100).sum())
    assert seen == [n_answer] and n_answer < ids.numel() / 2
    assert torch.allclose(answer.loss, full.loss, atol=1e-5)
    assert any("lora_A" in n for n in full_grads) and any("lora_B" in n for n in full_grads)
    assert ("modules_to_save" in " ".join(full_grads)) == bool(modules_to_save)
    for name, grad in full_grads.items():
        assert grad.abs().sum() > 0, name
        assert torch.allclose(answer_grads[name], grad, atol=1e-5), name
    # TRL's metrics get what its own head gives: per-position log-probs, entropy, top-1, the label mask
    with torch.no_grad():
        logits = full.logits[:, :-1]
        mask = labels[:, 1:] != -100
        log_p = logits.log_softmax(-1)
        picked = log_p.gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0]
    assert torch.equal(answer.label_mask, mask)
    assert torch.allclose(answer.log_probs, picked * mask, atol=1e-5)
    entropy = -(log_p.exp() * log_p).sum(-1) * mask
    assert torch.allclose(answer.entropy, entropy, atol=1e-5)
    assert torch.equal(answer.is_top1, (logits.argmax(-1) == labels[:, 1:]) & mask)


def test_a_batch_without_answer_tokens_is_a_zero_loss_with_gradients():
    from peft import LoraConfig, get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    from train.answer_logits import add_answer_only_head

    base = tiny_qwen3()
    add_fused_lm_head(base)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=LORA_TARGETS))
    add_answer_only_head(base)
    ids, attention, labels = batch()
    out = model(input_ids=ids[2:], attention_mask=attention[2:], labels=labels[2:], fused_lm_head=True)
    out.loss.backward()  # the backward pass runs (DDP needs every rank to take part)
    assert out.loss.item() == 0.0
    # without fused_lm_head the forward is the model's own (generation, evaluation with logits)
    assert model(input_ids=ids[:1]).logits.shape == (1, 24, 300)


@pytest.mark.parametrize("boundaries", ["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("attn", ["eager", "sdpa", SDPA_VARLEN])
def test_packed_rows_stay_apart(attn, boundaries):
    """A padding-free batch from TRL's own collator (one row, position_ids restarting per sequence) gives
    every sequence the logits it has alone: no row attends to another, whether the model reads the
    boundaries off position_ids or gets the collator's cu_seq_lens too. Each kernel in PACKING_KERNELS that
    runs a backward pass on a CPU is checked here (flex_attention has none)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    assert attn in PACKING_KERNELS
    model = tiny_qwen3(attn).eval()
    rows = [torch.randint(0, 300, (n,)).tolist() for n in (9, 5, 12)]
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": r} for r in rows]
    )
    assert "attention_mask" not in packed and packed["input_ids"].shape == (1, 26)
    extra = {k: packed[k] for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
    with torch.no_grad():
        alone = torch.cat([model(torch.tensor([r]), use_cache=False).logits for r in rows], 1)
        together = model(
            input_ids=packed["input_ids"],
            position_ids=packed["position_ids"],
            use_cache=False,
            **(extra if boundaries == "cu_seq_lens" else {}),
        ).logits
        leaking = model(input_ids=packed["input_ids"], use_cache=False).logits  # one long sequence
    assert torch.allclose(together, alone, atol=1e-5)
    assert not torch.allclose(leaking, alone, atol=1e-3)  # so the comparison can fail


def test_sdpa_varlen_keeps_several_packed_rows_apart():
    """Two rows of two packed sequences each, with position_ids only (one sequence starts at position 5):
    every sequence gets the logits it has alone, through sdpa's block mask for the batch of two and split
    at its bounds for one row."""
    model = tiny_qwen3(SDPA_VARLEN).eval()
    torch.manual_seed(4)
    layout = [[(6, 0), (4, 0)], [(3, 5), (7, 0)]]  # (length, first position) of each sequence, per row
    rows = [[(torch.randint(0, 300, (n,)), torch.arange(at, at + n)) for n, at in row] for row in layout]
    ids = torch.stack([torch.cat([s for s, _ in row]) for row in rows])
    positions = torch.stack([torch.cat([p for _, p in row]) for row in rows])
    with torch.no_grad():
        alone = torch.stack(
            [
                torch.cat([model(s[None], position_ids=p[None], use_cache=False).logits[0] for s, p in row])
                for row in rows
            ]
        )
        together = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        one_row = model(input_ids=ids[1:], position_ids=positions[1:], use_cache=False).logits
    assert torch.allclose(together, alone, atol=1e-5)
    assert torch.allclose(one_row, alone[1:], atol=1e-5)


@pytest.mark.parametrize("answer_only", [False, True], ids=["full-head", "answer-only-head"])
def test_padding_free_batches_train_as_padded_ones(answer_only):
    """The tiny profile's batches: TRL's collator, padded for sdpa or padding-free for sdpa_varlen, under
    PEFT with the output layer trained. The loss and every trainable gradient agree to 1e-5, and the
    padding-free row has no pad slot."""
    from peft import LoraConfig, get_peft_model
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
    from trl.trainer.utils import add_fused_lm_head

    from train.answer_logits import add_answer_only_head

    torch.manual_seed(2)
    rows = []
    for prompt, answer in ((14, 6), (9, 11), (20, 4), (5, 3)):
        ids = torch.randint(1, 300, (prompt + answer,)).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(rows)
    flat = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    real = sum(len(r["input_ids"]) for r in rows)
    assert padded["input_ids"].numel() > real == flat["input_ids"].numel()

    def loss_and_grads(attn, inputs):
        base = tiny_qwen3(attn)
        add_fused_lm_head(base)
        torch.manual_seed(3)
        model = get_peft_model(
            base,
            LoraConfig(
                r=8,
                target_modules=LORA_TARGETS,
                modules_to_save=["embed_tokens", "lm_head"],
                init_lora_weights=False,
            ),
        )
        if answer_only:
            add_answer_only_head(base)
        out = model(**inputs, use_cache=False, **({"fused_lm_head": True} if answer_only else {}))
        out.loss.backward()
        return out.loss, {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    padded_loss, padded_grads = loss_and_grads("sdpa", padded)
    flat_loss, flat_grads = loss_and_grads(SDPA_VARLEN, flat)
    assert torch.allclose(flat_loss, padded_loss, atol=1e-5)
    assert any("lora_A" in n for n in padded_grads) and any("modules_to_save" in n for n in padded_grads)
    for name, grad in padded_grads.items():
        assert grad.abs().sum() > 0, name
        assert torch.allclose(flat_grads[name], grad, atol=1e-5), name


def test_sdpa_varlen_leaves_padded_batches_and_decoding_to_sdpa():
    """Padded batches (evaluation, generation) and cached decoding give exactly sdpa's results."""
    ids, attention, _ = batch()
    sdpa, varlen = tiny_qwen3("sdpa").eval(), tiny_qwen3(SDPA_VARLEN).eval()
    varlen.load_state_dict(sdpa.state_dict())
    with torch.no_grad():
        for model_inputs in ({"input_ids": ids, "attention_mask": attention}, {"input_ids": ids[:1]}):
            assert torch.equal(varlen(**model_inputs).logits, sdpa(**model_inputs).logits)
    generate = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(
        varlen.generate(ids[:2], attention_mask=attention[:2], **generate),
        sdpa.generate(ids[:2], attention_mask=attention[:2], **generate),
    )


def _tiny_args(*flags):
    return parse_args(["--config", str(CONFIG_DIR / "train" / "tiny.yaml"), *flags])


def test_packing_is_refused_where_rows_would_attend_to_each_other():
    _, sft, model = _tiny_args("--packing", "true")
    check_packing(sft, model)  # sdpa keeps packed rows apart
    with pytest.raises(TrainConfigError, match="packing_strategy: wrapped .* attend to each other"):
        check_packing(*_tiny_args("--packing", "true", "--packing_strategy", "wrapped")[1:])
    _, sft, model = _tiny_args("--padding_free", "true")
    model.attn_implementation = "paged|sdpa"
    with pytest.raises(TrainConfigError, match="padding_free: true needs an attention kernel"):
        check_packing(sft, model)


@pytest.mark.parametrize(
    "profile,setting",
    [("qwen3-4b-liger.yaml", "use_liger_kernel: true"), ("qwen3-4b-qlora.yaml", "load_in_4bit: true")],
)
def test_gpu_profiles_validate_and_refuse_plainly_on_a_cpu(profile, setting, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from train.__main__ import main

    path = CONFIG_DIR / "train" / profile
    for flags in ([], ["--bf16", "false"]):  # the GPU-only setting is named, whatever else needs a GPU
        assert main(["--config", str(path), "--output_dir", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and "Traceback" not in err
        assert f"{profile}: {setting}" in err and "needs a GPU" in err and "configs/train/tiny.yaml" in err
    # every other field of the profile is valid: without its GPU-only settings it parses on this machine
    raw = yaml.safe_load(path.read_text())
    raw.update(bf16=False, attn_implementation="sdpa", use_liger_kernel=False, load_in_4bit=False)
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text(yaml.safe_dump(raw))
    dimmem_args, sft, model = parse_args(["--config", str(cpu)])
    assert sft.max_length == 12288 and model.lora_r == 16 and dimmem_args.answer_only_logits is False
    if profile == "qwen3-4b-qlora.yaml":
        from trl import get_quantization_config

        model.load_in_4bit = True
        model.dtype = "bfloat16"
        quant = get_quantization_config(model)
        assert quant.load_in_4bit and quant.bnb_4bit_quant_type == "nf4" and quant.bnb_4bit_use_double_quant


def test_padding_estimate_follows_the_sampler():
    from datasets import Dataset

    from train.data import padding_efficiency

    torch.manual_seed(0)
    lengths = torch.randint(700, 1300, (200,)).tolist()
    rows = Dataset.from_dict({"input_ids": [[1] * n for n in lengths]})
    random = padding_efficiency(rows, 8, grouped=False, seed=0)
    grouped = padding_efficiency(rows, 8, grouped=True, seed=0)
    assert 0.75 < random < 0.87 and grouped > 0.94
    assert padding_efficiency(rows, 1) == 1.0


def test_packing_fill_counts_rows_per_bin():
    from datasets import Dataset

    from train.data import packing_fill

    rows = Dataset.from_dict({"input_ids": [[1] * n for n in (6, 4, 5, 5, 3)]})
    assert packing_fill(rows, 10) == (5 / 3, 23 / 30)  # bins 6+4, 5+5, 3


def test_model_flops_follow_the_benchmark_formula():
    from transformers import AutoConfig

    from train.throughput import attention_length, model_flops_per_token

    bench = yaml.safe_load((CONFIG_DIR / "train" / "qwen3-4b-bench.yaml").read_text())
    cfg = AutoConfig.for_model("qwen3", **bench["architecture"])
    # BENCHMARKS.md: N = 3.97 G with the LM head, 19.7 GFLOP per token at 8,163 tokens
    assert model_flops_per_token(cfg, 8163) == pytest.approx(19.7e9, rel=0.01)
    assert attention_length([8163] * 4) == 8163 and attention_length([1, 3]) == 2.5


def test_model_flops_of_a_config_without_head_dim():
    """Qwen2's config (as transformers reads it from a GGUF file) has no head_dim: the FLOPs count takes
    hidden size over heads, the same as a config that states it."""
    from transformers import Qwen2Config, Qwen3Config

    from train.throughput import model_flops_per_token

    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    qwen2 = Qwen2Config(**shape, num_attention_heads=2, num_key_value_heads=1)
    stated = Qwen3Config(**shape, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    assert model_flops_per_token(qwen2, 100) == model_flops_per_token(stated, 100) > 0


@pytest.mark.parametrize("native", [True, False])
def test_bf16_autocast_on_a_cpu_only_where_the_cpu_has_it(native, monkeypatch, capsys):
    """A CPU profile's `bf16: true` keeps bf16 autocast on a CPU with avx512_bf16 or AMX; on one without
    (emulated, about 20x slower than float32) it trains in float32 and says so in one line."""
    import train.args

    monkeypatch.setattr(train.args, "cpu_has_bf16", lambda: native)
    _, sft, _ = _tiny_args("--bf16", "true", "--use_cpu", "true")
    err = capsys.readouterr().err
    assert (sft.bf16, sft.mixed_precision) == ((True, "bf16") if native else (False, "no"))
    assert ("lacks (no avx512_bf16 or AMX): training in float32" in err) is not native
