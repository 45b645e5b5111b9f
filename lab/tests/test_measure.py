"""measure.py: the gap statistics a benchmark logs per step, checked by hand on a made batch."""
import pytest
import torch

import evisd
from lab import measure
from rollout import KIND_IDS

S, A_ = KIND_IDS["search"], KIND_IDS["answer"]


def made_batch():
    """Two episodes: prompt, think, search span, info, think, answer span, padding."""
    kind = torch.tensor([[0, 0, 0, 0, S, S, S, 0, 0, 0, 0, A_, A_, 0]] * 2)
    gen = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0]] * 2)
    torch.manual_seed(0)
    return kind, gen, -torch.rand(2, 14) * 3


def test_gap_stats_by_sign_and_kind():
    kind, gen, lp_s = made_batch()
    lp_t = lp_s.clone()
    lp_t[0] += 0.3                                                 # A > 0 episode: teacher +0.3
    lp_t[1] -= 1.0                                                 # A < 0 episode: teacher -1.0
    adv = torch.tensor([1.0, -1.0])
    token_adv = evisd.evisd_correction(adv, lp_t - lp_s, gen, (kind > 0) & gen.bool(), 0.2, 5.0)
    st = measure.gap_stats(adv, lp_t - lp_s, token_adv, gen, kind)
    assert st["search_gap_pos"] == pytest.approx(0.3, abs=1e-5)
    assert st["answer_gap_neg"] == pytest.approx(-1.0, abs=1e-5)
    assert st["search_gap_abs_max"] == pytest.approx(1.0, abs=1e-5)
    assert st["search_tokens"] == 6 and st["answer_tokens"] == 4
    # every action token moved, thinking did not: 10 of 18 generated tokens
    assert st["modulated_frac"] == pytest.approx(10 / 18)
    # w = Â / A = 1 + 0.2 tanh(5 gap) sign(A), on the answer tokens of both episodes
    w = [1 + 0.2 * torch.tanh(torch.tensor(5 * 0.3)).item(),
         1 - 0.2 * torch.tanh(torch.tensor(-5.0)).item()]
    assert st["answer_w_mean"] == pytest.approx(sum(w) / 2, rel=1e-5)


def test_no_gap_moves_nothing():
    kind, gen, lp_s = made_batch()
    adv = torch.tensor([0.5, -0.5])
    st = measure.gap_stats(adv, torch.zeros_like(lp_s), adv[:, None] * gen, gen, kind)
    assert st["modulated_frac"] == 0 and st["search_w_mean"] == 1.0
    assert st["search_gap_abs_mean"] == 0.0


def test_the_measurement_never_overwrites_what_the_step_logs(tmp_path, monkeypatch):
    """MEASURE's values sit beside the step's: a key both have keeps the step's value."""
    from test_train import rows, run
    monkeypatch.setattr(measure, "measure", lambda cfg, record: {"modulated_frac": -1.0,
                                                                "reward": -1.0, "probe": 7})
    (row,) = rows(run(tmp_path, "measured", "--RL_STEPS=1", "--EVAL_EVERY=0", "--MEASURE=True"))
    assert row["probe"] == 7 and row["modulated_frac"] >= 0 and row["reward"] >= 0
