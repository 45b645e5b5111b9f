"""LoRA (LORA_RANK > 0): only the adapter trains; the base weights, held in the compute dtype, stay
byte for byte; the KL's reference is the same model with its adapter off, exactly the base; and a
LoRA run resumes, is evaluated and merges into a plain HF directory. (One RL step per method and
ablation row under LoRA, float32 and bf16, is in test_device.py.)"""
import copy
import json
import os
import runpy
import sys

import pytest

peft = pytest.importorskip("peft", reason="LoRA needs peft, which this environment lacks")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM

import evaluate
import model
import train
from lab import export
from test_device import CFG, DTYPES, device, sampled  # noqa: F401 (fixtures)
from test_rollout import tok, trained, world  # noqa: F401 (fixtures)
from test_train import TINY, rows, run, strip_timing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def with_lora(lm, dtype=torch.float32, rank=4):
    return model.add_lora(copy.deepcopy(lm), rank, 32.0, dtype, "the-base")


def batch_logprobs(lm, r, dtype):
    with torch.no_grad(), model.autocast(device, dtype):
        return model.token_logprobs(lm, r.input_ids.to(device), r.attention_mask.to(device),
                                    r.gen_mask.to(device))


def test_an_adapter_starts_as_exactly_its_base_and_only_it_trains(sampled):
    lm, r = sampled
    lora = with_lora(lm)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    # A and B on each of the 7 projections of each layer, nothing else
    layers = lm.config.num_hidden_layers
    assert len(trainable) == 2 * 7 * layers and all(".lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == set(model.LORA_TARGETS)
    # B starts at 0: the adapted model is the base, log-prob for log-prob
    assert torch.equal(batch_logprobs(lora, r, torch.float32),
                       batch_logprobs(lm, r, torch.float32))
    with pytest.raises(ValueError):   # a projection name the model lacks is PEFT's error
        peft.get_peft_model(copy.deepcopy(lm), peft.LoraConfig(r=2, target_modules=["nope"]))


@pytest.mark.parametrize("step_dtype", DTYPES)
def test_rl_steps_move_only_the_adapter_and_the_reference_is_the_base(sampled, world, tok,
                                                                      step_dtype, monkeypatch):
    """Two of train.rl_step's updates under LoRA: the gradients reach the adapter alone, the base
    weights (in the compute dtype) keep every byte, the adapter is float32 and moves, and the
    reference, the policy with its adapter off, scores exactly as the base model does."""
    lm, r = sampled
    dtype = getattr(torch, step_dtype)
    cfg = dict(CFG, LR=1e-3, DTYPE=step_dtype, LORA_RANK=4)
    lora = with_lora(lm, dtype)
    base = {n: p.detach().clone() for n, p in lora.named_parameters() if not p.requires_grad}
    adapter = {n: p.detach().clone() for n, p in lora.named_parameters() if p.requires_grad}
    assert {p.dtype for p in base.values()} == {dtype}
    assert {p.dtype for p in adapter.values()} == {torch.float32}
    reference = train.frozen_reference(lora)
    assert reference is lora                          # no copy of the weights
    trained_params = [p for p in lora.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained_params, lr=cfg["LR"])
    monkeypatch.setattr(train.rollout, "rollout", lambda *args, **kwargs: r)
    kls = [train.rl_step(cfg, step, world, lora, reference, tok, opt)[0]["kl"]
           for step in (0, 1)]
    assert kls[0] == 0.0 and kls[1] > 0
    after = dict(lora.named_parameters())
    assert all(after[n].grad is None and torch.equal(after[n], p) for n, p in base.items())
    assert all(after[n].grad is not None for n in adapter)
    assert max((after[n] - p).abs().max().item() for n, p in adapter.items()) > 1e-4
    # The reference: the adapter off gives the base model's log-probs, to the last bit.
    plain = copy.deepcopy(lm).to(dtype)
    with model.without_adapter(lora):
        off = batch_logprobs(lora, r, dtype)
    assert torch.equal(off, batch_logprobs(plain, r, dtype))
    assert not torch.equal(batch_logprobs(lora, r, dtype), off)


def lora_run(tmp_path, name, *extra):
    # OPSD's advantage is the teacher's gap, so the adapter moves even where every reward is 0,
    # once a warm-up of 40 steps writes actions for the teacher to re-score.
    return run(tmp_path, name, "--LORA_RANK=4", "--METHOD=opsd", "--LR=1e-3", "--SFT_STEPS=40",
               "--PPO_EPOCHS=1", *extra)


def test_a_lora_run_resumes_is_evaluated_and_merges(tmp_path, capsys, monkeypatch):
    full = lora_run(tmp_path, "full")
    logged = [r for r in rows(full) if not r.get("eval")]
    assert logged[0]["kl"] == 0.0 and logged[-1]["kl"] > 0
    # A checkpoint holds the adapter, not the base; its base is named twice.
    ckpt = os.path.join(full, "ckpt-000004")
    assert {"adapter_model.safetensors", "adapter_config.json", "state.pt"} <= set(os.listdir(ckpt))
    assert "model.safetensors" not in os.listdir(ckpt)
    state = torch.load(os.path.join(ckpt, "state.pt"), weights_only=False)
    sft = state["sft_path"]
    assert sft.startswith(f"{tmp_path}/sft-") and os.path.isdir(sft)
    assert json.load(open(os.path.join(ckpt, "adapter_config.json")))[
        "base_model_name_or_path"] == sft

    # 2 steps, then --resume for 2 more: the uninterrupted run's values.
    part = lora_run(tmp_path, "part", "--RL_STEPS=2")
    lora_run(tmp_path, "part", "--resume")
    assert strip_timing(rows(part)) == strip_timing(rows(full))
    # The adapter's shape defines the run: --resume refuses another.
    with pytest.raises(SystemExit, match=r"another run: LORA_RANK=8 \(checkpoint: 4\)"):
        lora_run(tmp_path, "part", "--resume", "--LORA_RANK=8")

    # evaluate.py scores it, and the warm-up it started from.
    js = str(tmp_path / "rows.json")
    evaluate.main([full, "--worlds", "1", "--json", js])
    (got,) = json.load(open(js))["runs"]
    assert got["hop1_n"] > 0 and "macro" in got and got["warmup_macro"] is not None

    # The export, run as its command: a plain HF directory whose log-probs are the LoRA model's.
    merged = str(tmp_path / "merged")
    monkeypatch.setattr(sys, "argv", ["lab/export.py", full, merged])
    runpy.run_path(os.path.join(ROOT, "lab", "export.py"), run_name="__main__")
    assert f"saved {merged}: a plain HF directory" in capsys.readouterr().out
    assert "adapter_config.json" not in os.listdir(merged)
    plain = AutoModelForCausalLM.from_pretrained(merged)
    lora, _ = model.load_model(ckpt)
    ids = torch.randint(5, 300, (3, 40))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = model.token_logprobs(lora, ids, mask)
        assert (model.token_logprobs(plain, ids, mask) - want).abs().max() < 1e-4
        with model.without_adapter(lora):          # and the adapter made a difference
            assert (model.token_logprobs(lora, ids, mask) - want).abs().max() > 1e-3
    with pytest.raises(SystemExit, match="exists already"):
        export.export(full, merged)


def test_the_3b_preset_trains_an_adapter_on_a_pretrained_standin(tmp_path, standin_dir,
                                                                 monkeypatch):
    """The 3B LoRA preset on the pretrained-style stand-in under bf16: the base loads in bf16
    (no warm-up trains it), the adapter is float32, its checkpoint names the model directory as
    its base, --resume reads the base once, and evaluate.py scores it. Random weights: this
    checks the path, not learning."""
    out = str(tmp_path / "run")
    small = [a for a in TINY if not a.startswith(("--SFT_STEPS", "--PPO_EPOCHS"))]
    args = ["config/qwen2.5-3b-instruct-lora.py", *small, f"--MODEL={standin_dir}",
            "--MAX_NEW_TOKENS=8", "--DTYPE=bfloat16", f"--OUT_DIR={out}",
            f"--SFT_DIR={tmp_path}/sft"]
    policy = train.main(args + ["--RL_STEPS=2"])
    dtypes = {True: set(), False: set()}            # trained or not: the dtypes held
    for p in policy.parameters():
        dtypes[p.requires_grad].add(p.dtype)
    assert dtypes == {False: {torch.bfloat16}, True: {torch.float32}}
    ckpt = os.path.join(out, "ckpt-000002")
    assert json.load(open(os.path.join(ckpt, "adapter_config.json")))[
        "base_model_name_or_path"] == standin_dir
    assert torch.load(os.path.join(ckpt, "state.pt"), weights_only=False)["sft_path"] == standin_dir
    # --resume puts the adapter and the optimizer state onto the policy: no second base is built
    # beside it (at 7B, 15 GB more host memory per process).
    built, from_pretrained = [], AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: built.append(a[0]) or from_pretrained(*a, **k))
    train.main(args + ["--RL_STEPS=3", "--resume"])
    assert built == [standin_dir]
    assert [r["step"] for r in rows(out) if not r.get("eval")] == [0, 1, 2]
    monkeypatch.undo()
    js = str(tmp_path / "rows.json")
    evaluate.main([out, "--worlds", "1", "--json", js])
    (got,) = json.load(open(js))["runs"]
    assert got["hop1_n"] > 0 and "macro" in got
