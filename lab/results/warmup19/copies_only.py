"""Probe (session 5): the context loss on copies only. A document introduces names no model can
predict (their first mention) and repeats others (the searched entity, names met before); the
first kind adds only noise to the copy signal the context loss is for. Here a token read counts
in the context loss only if the pair (previous token, token) occurred earlier in its episode.
Then warmup_sweep.py as usual; rows go to out/sweep/results.jsonl.

    python lab/results/warmup19/copies_only.py copies-450 --seeds 1,7 --SFT_STEPS=450
"""
import os
import sys

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(DOCS), DOCS]

import train  # noqa: E402
import warmup_sweep  # noqa: E402

full_batch = train.sft_batch


def sft_batch(cfg, tokenizer, step, privileged_frac):
    b = full_batch(cfg, tokenizer, step, privileged_frac)
    for i, row in enumerate(b["input_ids"].tolist()):
        seen = set()
        for t in range(1, len(row)):
            pair = (row[t - 1], row[t])
            if pair not in seen:
                b["context_mask"][i, t] = 0
            seen.add(pair)
    return b


train.sft_batch = sft_batch
if __name__ == "__main__":
    warmup_sweep.main(sys.argv[1:])
