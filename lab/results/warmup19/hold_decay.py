"""Probe (session 5): the warm-up's rate held at its peak, then decayed. With cosine the rate
has fallen to 55% of its peak by the middle of the run, where most seeds leave the plateau
(steps 350-650 of 900); two runs of one seed that differed only in how fast it fell ended one
learned and one stuck (lab/results/warmup-probes.md, fifth probes). Here: the same linear warm-up over
the first 10% of STEPS, the peak held until DECAY_AT (a fraction of STEPS), then a linear fall
to 10%. Then warmup_sweep.py as usual; rows go to out/sweep/results.jsonl.

    STEPS=600 DECAY_AT=0.8 python lab/results/warmup19/hold_decay.py hold-600 --seeds 2,7 --SFT_STEPS=600
"""
import os
import sys

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(DOCS), DOCS]

import torch  # noqa: E402

import warmup_sweep  # noqa: E402

STEPS, DECAY_AT = int(os.environ["STEPS"]), float(os.environ.get("DECAY_AT", "0.8"))
LambdaLR = torch.optim.lr_scheduler.LambdaLR


def hold_then_decay(step):
    warmup, start = max(STEPS // 10, 1), DECAY_AT * STEPS
    if step < warmup:
        return (step + 1) / warmup
    return 1.0 if step < start else 1.0 - 0.9 * (step - start) / max(STEPS - start, 1)


torch.optim.lr_scheduler.LambdaLR = lambda opt, lr_lambda: LambdaLR(opt, hold_then_decay)
if __name__ == "__main__":
    warmup_sweep.main(sys.argv[1:])
