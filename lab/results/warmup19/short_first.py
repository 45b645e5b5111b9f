"""Probe (session 4): a warm-up whose first SHORT_STEPS steps show one-hop questions with
SHORT_TOPK documents per search and SHORT_BATCH episodes (about 90 tokens each, against 230),
because an induction head is reported to form sooner in short contexts. Then warmup_sweep.py
as usual; rows go to out/sweep/results.jsonl.

    SHORT_STEPS=200 SHORT_TOPK=1 SHORT_BATCH=32 python lab/results/warmup19/short_first.py sf200b32-450 \
        --seeds 1,7 --SFT_STEPS=450 --SFT_CONTEXT_LOSS=1.0
"""
import os
import sys

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(DOCS), DOCS]

import toy_world as tw  # noqa: E402
import train  # noqa: E402
import warmup_sweep  # noqa: E402

SHORT = int(os.environ["SHORT_STEPS"])
TOP_K, BATCH = int(os.environ.get("SHORT_TOPK", "1")), int(os.environ.get("SHORT_BATCH", "0"))
full_batch, full_world = train.sft_batch, tw.training_world


def one_hop_world(*args, **kwargs):
    """The step's world with only its one-hop questions in each split."""
    world = full_world(*args, **kwargs)
    split = world.split
    world.split = lambda name: [q for q in split(name) if q.hops == 1]
    return world


def sft_batch(cfg, tokenizer, step, privileged_frac):
    if step >= SHORT:
        return full_batch(cfg, tokenizer, step, privileged_frac)
    tw.training_world = one_hop_world
    try:
        return full_batch(dict(cfg, TOP_K=TOP_K, SFT_BATCH=BATCH or cfg["SFT_BATCH"]), tokenizer, step, privileged_frac)
    finally:
        tw.training_world = full_world


train.sft_batch = sft_batch
if __name__ == "__main__":
    warmup_sweep.main(sys.argv[1:])
