"""LoRA (LORA_RANK > 0): only the adapter trains; the base weights, held in the compute dtype, stay
byte for byte; the KL's reference is the same model with its adapter off, exactly the base; and a
LoRA preset resumes on its base and is evaluated. (One RL step per method and ablation row under
LoRA, float32 and bf16, is in test_device.py; a LoRA run merged by lab/export.py, in
lab/tests/test_lora_export.py.)"""
import copy
import json
import os

import pytest

peft = pytest.importorskip("peft", reason="LoRA needs peft, which this environment lacks")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM

import evaluate
import model
import train
from test_device import CFG, DTYPES, device, sampled  # noqa: F401 (fixtures)
from test_train import TINY, rows


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
