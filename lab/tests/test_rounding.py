"""lab/precision.py: bf16 rounding moves little of EviSD's correction. A guard, on a trained
embedded model: if a change makes the gap fragile under the GPU's precision, this fails."""
import grpo
import train
from lab import expert, precision

GUARD = 0.10     # rounding may move at most this share of the correction's mass, per kind


def test_rounding_moves_under_a_tenth_of_the_correction(tok, trained, world):
    cfg = dict(train.DEFAULTS, GROUP_SIZE=4)
    questions = world.split("train")
    batches = []
    for b in range(3):
        r = expert.expert_rollouts(cfg, tok, world, questions[4 * b:4 * b + 4], seed=b)
        batches.append((world, r, grpo.group_advantages(r.rewards, 4)))
    result = precision.rounding(trained, tok, batches, cfg)
    print(precision.table(result))
    for kind in precision.KINDS:
        assert result[kind]["tokens"] > 20, kind
        assert 0 < result[kind]["share"] <= GUARD, (kind, result[kind])
