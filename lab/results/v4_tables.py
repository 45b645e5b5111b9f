"""Benchmark v4's paired table from the runs' records alone (lab/results/v4-runs/), so it can be
rebuilt on any machine, checkpoints or not, and read while protocol-v4.sh is still running.

    python lab/results/v4_tables.py [lab/results/v4-runs]

For every method, against GRPO on the seeds both have: the mean paired difference and its 95%
t-interval (evaluate.paired_differences) for held-out macro, 1-hop and 2-hop EM (18 worlds) and
for learning speed (lab/curves.py: clear step and area of each habit, the quick check's area),
with the number of seeds, the sd of the macro differences and the half-width reached. Trains and
evaluates nothing.
"""
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lab import curves  # noqa: E402
import evaluate   # noqa: E402

HELD_OUT = "18 worlds from 1000000"      # the cache key of protocol-v4.sh's evaluation
METHODS = ("evisd", "rlsd", "opsd", "sdar", "sd_search", "bicaa")


def rows(folder):
    """One row per finished run of the protocol (probes excluded)."""
    out = []
    for d in sorted(glob.glob(os.path.join(folder, "*-s[0-9]*"))):
        if os.path.basename(d).startswith("probe-"):
            continue
        cfg = json.load(open(os.path.join(d, "config.json")))
        em = json.load(open(os.path.join(d, "heldout-em.json"))).get(HELD_OUT)
        if em is None:
            continue
        metrics = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
        out.append({"group": cfg["METHOD"], "method": cfg["METHOD"], "seed": cfg["SEED"],
                    **{k: em.get(k) for k in ("macro", "hop1", "hop2", "hop3")},
                    **curves.speed(metrics, cfg["RL_STEPS"])})
    return out


def table(all_rows):
    keys = evaluate.PAIRED_KEYS + curves.SPEED_KEYS
    paired = evaluate.paired_differences(all_rows, "grpo", keys)
    grpo = [r for r in all_rows if r["method"] == "grpo"]
    fmt = evaluate._interval
    lines = [f"GRPO: {len(grpo)} runs, held-out macro mean "
             f"{statistics.mean(r['macro'] for r in grpo):.3f}" if grpo else "no GRPO run yet", "",
             "| method | seeds | macro − GRPO [95%] | sd | 1-hop | 2-hop | premature clear | "
             "partial clear | quick-check area |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in METHODS:
        if m not in paired:
            continue
        p = paired[m]
        iv = p["intervals"]
        diffs = [p["diff"][s]["macro"] for s in p["seeds"] if p["diff"][s]["macro"] is not None]
        sd = f"{statistics.stdev(diffs):.3f}" if len(diffs) > 1 else "–"
        cells = [fmt(*iv[k]) if k in iv else "–"
                 for k in ("macro", "hop1", "hop2", "premature_clear", "partial_clear",
                           "quick_area")]
        lines.append(f"| {m} | {len(p['seeds'])} | {cells[0]} | {sd} | " + " | ".join(cells[1:])
                     + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(rows(sys.argv[1] if len(sys.argv) > 1 else
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "v4-runs"))))
