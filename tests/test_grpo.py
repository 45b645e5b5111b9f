"""Tests for grpo.py: group advantages and the clipped policy loss against hand computations."""
import math

import pytest
import torch

import grpo


def test_group_advantages_hand_example():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])          # two groups of three
    adv = grpo.group_advantages(r, 3)
    # group 1: mean 1/3, unbiased std sqrt(1/3)
    mean, std = 1 / 3, math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    expected = [(1 - mean) / (std + 1e-4), (0 - mean) / (std + 1e-4), (0 - mean) / (std + 1e-4)]
    assert torch.allclose(adv[:3], torch.tensor(expected), atol=1e-6)
    assert torch.equal(adv[3:], torch.zeros(3))                 # equal rewards: no signal
    assert adv[:3].sum().abs() < 1e-6


def test_group_advantages_matches_trl_formula():
    torch.manual_seed(0)
    r = torch.rand(32)
    g = r.view(-1, 8)
    trl = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).view(-1)
    assert torch.allclose(grpo.group_advantages(r, 8), trl)


def test_group_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError, match="10 rewards.*groups of 4"):
        grpo.group_advantages(torch.zeros(10), 4)
    with pytest.raises(ValueError, match="group_size"):
        grpo.group_advantages(torch.zeros(4), 1)


def test_policy_loss_hand_computed():
    logp = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.7]]))
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.7]]))
    adv = torch.tensor([[1.0, 1.0, -2.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, stats = grpo.policy_loss(logp, old, None, adv, mask, clip_eps=0.2)
    # ratios 1.0, 1.8, 0.4: token 2 clips at 1.2 (A>0), token 3 clips at 0.8 (A<0)
    per = [-min(1.0 * 1, 1.0 * 1), -min(1.8 * 1, 1.2 * 1), -min(0.4 * -2, 0.8 * -2)]
    assert loss.item() == pytest.approx(sum(per) / 3, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    assert stats["ratio"] == pytest.approx((1.0 + 1.8 + 0.4) / 3, rel=1e-5)
    assert stats["kl"] == 0.0


def test_policy_loss_kl_is_k3_and_nonnegative():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    zero = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    loss, stats = grpo.policy_loss(logp, logp.detach(), ref, zero, mask, kl_coef=0.5)
    d = ref - logp
    k3 = (torch.exp(d) - d - 1).mean()
    assert stats["kl"] == pytest.approx(k3.item(), rel=1e-6) and k3 > 0
    assert loss.item() == pytest.approx(0.5 * k3.item(), rel=1e-6)


def test_policy_loss_gradient_direction():
    logits = torch.zeros(2, 3, requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, :1].expand(2, 2)      # [2, 2] same token twice
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, _ = grpo.policy_loss(logp, logp.detach(), None, adv, torch.ones(2, 2))
    loss.backward()
    # Gradient descent raises the sampled token's logit where A > 0 and lowers it where A < 0.
    assert logits.grad[0, 0] < 0 and logits.grad[1, 0] > 0


def test_policy_loss_ignores_masked_tokens():
    logp = torch.tensor([[-1.0, -5.0]], requires_grad=True)
    loss, _ = grpo.policy_loss(logp, torch.tensor([[-1.0, -1.0]]), None,
                               torch.tensor([[1.0, 100.0]]), torch.tensor([[1, 0]]))
    loss.backward()
    assert logp.grad[0, 1] == 0 and loss.item() == pytest.approx(-1.0)
