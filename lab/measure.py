"""What a benchmark measures beside each RL step, switched on by train.py's MEASURE: the oracle's
label shares (what the policy does: premature answers, partial-name searches, ...; lab/curves.py
reads how fast each habit goes) and, for EviSD and its peers, the statistics of the teacher's gap.

train.py calls ``measure(cfg, record)`` once per step, with the ``record`` rl_step returns, and
logs what it returns beside the step's own metrics.
"""
import torch

from lab import oracle
from rollout import KIND_IDS


def measure(cfg, record):
    """The oracle's label shares of the step's episodes, and the gap statistics (not GRPO's)."""
    r, world = record["rollouts"], record["world"]
    labels = [oracle.oracle_labels(world, q, turns, cfg["TOP_K"])
              for q, turns in zip(r.questions, r.turn_texts)]
    out = oracle.label_shares(labels)
    if cfg["METHOD"] != "grpo":
        device = record["adv"].device
        out.update(gap_stats(record["adv"], record["gap"], record["token_adv"],
                             r.gen_mask.to(device), r.action_kind.to(device)))
    return out


@torch.no_grad()
def gap_stats(adv, gap, token_adv, gen_mask, action_kind):
    """What a correction did on a batch: the fraction of generated tokens whose advantage it
    changed and, per action kind, the mean and max |gap|, the mean w = Â / A (EviSD:
    1 + lambda * tanh(tau * gap) * sign(A) on content tokens), and the mean gap on episodes with
    A > 0 and with A < 0."""
    gen = gen_mask.bool()
    A = adv.float()[:, None].expand_as(token_adv)
    w = torch.where(A != 0, token_adv / torch.where(A == 0, 1.0, A), torch.ones_like(A))
    stats = {"modulated_frac": ((w != 1) & gen).sum().item() / max(gen.sum().item(), 1)}
    for name, k in KIND_IDS.items():
        span = gen & (action_kind == k)
        g = gap[span]
        stats[f"{name}_tokens"] = int(span.sum())
        stats[f"{name}_gap_abs_mean"] = g.abs().mean().item() if g.numel() else 0.0
        stats[f"{name}_gap_abs_max"] = g.abs().max().item() if g.numel() else 0.0
        stats[f"{name}_w_mean"] = w[span].mean().item() if g.numel() else 1.0
        for sign, sel in (("pos", A > 0), ("neg", A < 0)):
            gs = gap[span & sel]
            stats[f"{name}_gap_{sign}"] = gs.mean().item() if gs.numel() else None
    return stats
