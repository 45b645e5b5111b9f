"""Probe (session 5): fewer training worlds, each seen many times. The warm-up builds a fresh
world for every step, so no document is ever seen twice; in small transformers, repeating
training examples is reported to shorten the plateau before sparse attention (a copy) emerges
(Zucchet et al. 2025, "The emergence of sparse attention: impact of data distribution and
benefits of repetition"). Here step s of the warm-up draws its episodes from world
s % POOL (its questions still sampled afresh each step), until step FRESH_AFTER (default:
never), after which every step has a fresh world again. RL's worlds are untouched. Then
warmup_sweep.py as usual; rows go to out/sweep/results.jsonl.

    POOL=30 python docs/warmup19/world_pool.py pool30-450 --seeds 1,7 --SFT_STEPS=450
    POOL=10 FRESH_AFTER=300 python docs/warmup19/world_pool.py pool10to300-450 --seeds 1,7 --SFT_STEPS=450
"""
import os
import sys

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(DOCS), DOCS]

import toy_world as tw  # noqa: E402
import warmup_sweep  # noqa: E402

POOL, FRESH_AFTER = int(os.environ["POOL"]), int(os.environ.get("FRESH_AFTER", 10**9))
fresh_world = tw.training_world


def pooled_world(stage, seed, step, scale=1.0):
    pooled = stage == "warmup" and step < FRESH_AFTER
    return fresh_world(stage, seed, step % POOL if pooled else step, scale)


tw.training_world = pooled_world
if __name__ == "__main__":
    warmup_sweep.main(sys.argv[1:])
