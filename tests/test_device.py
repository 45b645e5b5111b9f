"""The model, rollouts and both methods' losses on the device the suite is given
(``DEVICE=cuda python -m pytest``; the CPU by default), checked against the CPU in float32:
what lab/gpu_check.py runs on a GPU before it measures anything. On the CPU the RL steps run in
float32 and under bf16 autocast, the precision every GPU run computes in."""
import copy

import pytest
import torch

import evisd
import grpo
import model
import rollout
import runs
import search_env
import train
from conftest import DEVICE, needs_peft
from lab import expert
from test_rollout import _check_masks

# train.py's config on this device, every "auto" resolved: the dtype it computes in (bf16
# autocast on CUDA), and how far its log-probs may sit from the CPU's float32 ones: bf16 keeps
# 8 mantissa bits (0.4%).
CFG = train.configure([f"--DEVICE={DEVICE}", "--GROUP_SIZE=4"])[0]
device, dtype = runs.pick_device(CFG)
# The DTYPEs an RL step is checked in: on the CPU its own float32 and the GPU's bf16 autocast.
DTYPES = ("float32", "bfloat16") if device.type == "cpu" else (CFG["DTYPE"],)
LOGP_ATOL = 1e-5 if dtype == torch.float32 else 0.05


def test_token_logprobs_on_the_device_match_the_cpu(trained, world, tok):
    q = world.split("train")[0]
    ids = torch.tensor([tok.encode(model.render_prompt(tok, q)
                                   + "<think> x </think><search> a b </search>")])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        cpu = model.token_logprobs(trained, ids, mask)
        on_device = copy.deepcopy(trained).to(device)
        with model.autocast(device, dtype):
            got = model.token_logprobs(on_device, ids.to(device), mask.to(device))
    assert got.device.type == device.type and got.dtype == torch.float32
    assert (got.cpu() - cpu).abs().max() < LOGP_ATOL


def test_rollout_on_the_device_matches_a_fresh_forward(trained, world, tok):
    """Left padding, stop strings and finished rows on the device: every greedy token is the
    argmax of a plain forward over its transcript (float32, so no rounding can flip a tie)."""
    lm = copy.deepcopy(trained).to(device)
    qs = world.split("train")[:6]
    envs = [search_env.SearchEnv(world, q, max_turns=1 + i % 3) for i, q in enumerate(qs)]
    r = rollout.rollout(lm, tok, envs, max_new_tokens=24, greedy=True)
    # results come back for the env and the masks
    assert r.input_ids.device.type == "cpu"
    _check_masks(r, tok, world)
    with torch.no_grad():
        logits = lm(input_ids=r.input_ids.to(device),
                    attention_mask=r.attention_mask.to(device)).logits.float().cpu()
    gen = r.gen_mask[:, 1:].bool()
    chosen = logits[:, :-1].gather(-1, r.input_ids[:, 1:, None]).squeeze(-1)
    assert gen.sum() > 50 and ((logits[:, :-1].max(-1).values - chosen)[gen]).max() < 1e-3


@pytest.fixture(scope="module")
def sampled(trained, world, tok):
    """The trained model on the device and a batch of noisy expert episodes with mixed rewards
    (what a warmed-up policy samples: real action spans, some right, some wrong)."""
    r = expert.expert_rollouts(CFG, tok, world, world.split("train")[:4])
    assert 0 < r.rewards.sum() < len(r.rewards)
    return copy.deepcopy(trained).to(device), r


def test_evisd_advantages_on_the_device_are_bounded_and_keep_the_sign(sampled, world, tok):
    lm, r = sampled
    cfg = CFG
    adv = grpo.group_advantages(r.rewards, 4).to(device)                               # [N]
    with torch.no_grad(), model.autocast(device, dtype):
        logp = model.token_logprobs(lm, r.input_ids.to(device), r.attention_mask.to(device),
                                r.gen_mask.to(device), temperature=cfg["TEMPERATURE"])  # [N, T]
        token_adv, lp_teacher, _ = evisd.credit(lm, tok, world, r, adv, logp, cfg)
    assert token_adv.device.type == device.type and token_adv.shape == r.input_ids.shape
    gen, A = r.gen_mask.to(device).bool(), adv[:, None].expand_as(token_adv)
    assert (token_adv[~gen] == 0).all()
    ratio = token_adv[gen & (A != 0)] / A[gen & (A != 0)]
    lam = cfg["EVISD_LAMBDA"]
    # bounded by lambda |A|, never sign-flipped
    assert ratio.min() >= 1 - lam - 1e-6 and ratio.max() <= 1 + lam + 1e-6
    assert (ratio != 1).any() and torch.isfinite(lp_teacher).all()


# GRPO, EviSD, and each row of the paper's ablation table (train.py's EviSD block)
ROWS = {"grpo": {"METHOD": "grpo"}, "evisd": {}, "response": {"EVISD_SPAN": "response"},
        "gated_loss": {"EVISD_FORM": "gated_loss", "EVISD_SPAN": "response"},
        "answer_only": {"USE_SEARCH_EVIDENCE": False},
        "shared": {"TEACHER_CONTEXT": "shared"}}


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("step_dtype", DTYPES)
@pytest.mark.parametrize("lora_rank", (0, pytest.param(4, marks=needs_peft)))
def test_one_update_on_the_device_moves_the_weights(sampled, world, tok, row, step_dtype,
                                                    lora_rank, monkeypatch):
    """train.rl_step on the device, its world and rollout replaced by the sampled batch, with
    every weight trained or (LORA_RANK=4) a LoRA adapter. The reference is train.py's: a frozen
    copy of the policy, or the policy with its adapter off; either way the KL is exactly 0."""
    lm, r = sampled
    lm = copy.deepcopy(lm)
    cfg = dict(CFG, **ROWS[row], LR=1e-3, DTYPE=step_dtype, LORA_RANK=lora_rank)
    method = cfg["METHOD"]
    if lora_rank:
        lm = model.add_lora(lm, lora_rank, 32.0, getattr(torch, step_dtype), "base")
    ref = train.frozen_reference(lm)
    trained = [p for p in lm.parameters() if p.requires_grad]
    frozen = [p for p in lm.parameters() if not p.requires_grad]
    frozen_before = [p.detach().clone() for p in frozen]
    before = [p.detach().clone() for p in trained]
    opt = torch.optim.AdamW(trained, lr=cfg["LR"])
    monkeypatch.setattr(train.rollout, "rollout", lambda *args, **kwargs: r)
    metrics, record = train.rl_step(cfg, 0, world, lm, ref, tok, opt)
    assert "nonfinite_loss" not in metrics and metrics["kl"] == 0.0
    assert max((p.detach() - b).abs().max().item() for p, b in zip(trained, before)) > 1e-5
    assert bool(frozen) == bool(lora_rank)     # LoRA: the base weights are frozen
    assert all(torch.equal(p, b) for p, b in zip(frozen, frozen_before))
    assert (metrics["modulated_frac"] > 0) == (method == "evisd" and row != "gated_loss")
    assert (record["gap"] != 0).any() == (method == "evisd")
    assert ("extra_loss" in metrics) == (row == "gated_loss")


def test_gradient_checkpointing_on_the_device_gives_the_same_gradients(tok):
    ids = torch.tensor([[5, 17, 42, 99, 3, 250, 7], [8, 9, 10, 11, 12, 0, 0]], device=device)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2], device=device)
    grads = []
    for checkpointing in (False, True):
        lm = model.build_model(tok, "tiny").to(device).train()
        if checkpointing:
            model.enable_checkpointing(lm)
        model.token_logprobs(lm, ids, mask, chunk=3).sum().backward()
        grads.append([p.grad for p in lm.parameters()])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*grads))
