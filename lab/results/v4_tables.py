"""Benchmark v4's paired table from the runs' records alone (lab/results/v4-runs.jsonl.gz, read
by lab/packs.py), so it can be rebuilt on any machine, checkpoints or not.

    python lab/results/v4_tables.py [lab/results/v4-runs.jsonl.gz] [--plot curves-v4.png]

Three tables: each method's own held-out EM (mean over its seeds); every method against GRPO on
the seeds both have, and every peer against EviSD on the seeds both have (the protocol's two
readings): the mean paired difference and its 95% t-interval (report.paired_differences) for
held-out macro, 1-hop and 2-hop EM (18 worlds) and for learning speed (lab/curves.py: clear step
of each habit, the quick check's area), with the number of seeds, the sd of the macro
differences and the half-width reached. --plot draws the learning curves of every run from the
same records (lab/curves.py). Trains and evaluates nothing.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lab import curves, report  # noqa: E402
from lab import packs  # noqa: E402

WORLDS = 18          # protocol-v4.sh's EVAL_WORLDS_V4
METHODS = ("evisd", "rlsd", "opsd", "sdar", "sd_search", "bicaa")


def rows(path):
    """One row per finished run of the protocol (probes excluded) in the pack at ``path``."""
    out = []
    for run in packs.run_records(path):
        if run["name"].startswith("probe-"):
            continue
        cfg = run["config"]
        em = run.get("heldout_em", {}).get(report.em_key(cfg, WORLDS))
        if em is None:
            continue
        metrics = packs.metrics(run, path)
        out.append({"run": run["name"], "metrics": metrics,
                    "group": cfg["METHOD"], "method": cfg["METHOD"], "seed": cfg["SEED"],
                    **{k: em.get(k) for k in ("macro", "hop1", "hop2", "hop3")},
                    **curves.speed(metrics, cfg["RL_STEPS"])})
    return out


def means(all_rows):
    """Each method's own held-out EM, averaged over its seeds."""
    lines = ["| method | seeds | macro | 1-hop | 2-hop | seeds with 2-hop EM > 0.1 |",
             "|---|---|---|---|---|---|"]
    for m in ("grpo",) + METHODS:
        mine = [r for r in all_rows if r["method"] == m]
        if not mine:
            continue
        avg = {k: statistics.mean(r[k] for r in mine) for k in ("macro", "hop1", "hop2")}
        escaped = sum(r["hop2"] > 0.1 for r in mine)
        lines.append(f"| {m} | {len(mine)} | {avg['macro']:.3f} | {avg['hop1']:.3f} | "
                     f"{avg['hop2']:.3f} | {escaped} of {len(mine)} |")
    return "\n".join(lines)


def table(all_rows, baseline="grpo", methods=METHODS):
    """Paired differences of `methods` against `baseline`, one row per method."""
    keys = report.PAIRED_KEYS + curves.SPEED_KEYS
    paired = report.paired_differences(all_rows, baseline, keys)
    fmt = report.fmt_interval
    name = {"grpo": "GRPO", "evisd": "EviSD"}.get(baseline, baseline)
    lines = [f"| method | seeds | macro − {name} [95%] | sd | half-width | 1-hop | 2-hop | "
             "premature clear | partial clear | quick-check area |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        if m not in paired:
            continue
        p = paired[m]
        iv = p["intervals"]
        diffs = [p["diff"][s]["macro"] for s in p["seeds"] if p["diff"][s]["macro"] is not None]
        sd = f"{statistics.stdev(diffs):.3f}" if len(diffs) > 1 else "–"
        half = f"{(iv['macro'][2] - iv['macro'][1]) / 2:.3f}" if "macro" in iv else "–"
        cells = [fmt(*iv[k]) if k in iv else "–"
                 for k in ("macro", "hop1", "hop2", "premature_clear", "partial_clear",
                           "quick_area")]
        lines.append(f"| {m} | {len(p['seeds'])} | {cells[0]} | {sd} | {half} | "
                     + " | ".join(cells[1:]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    plot = None
    if "--plot" in args:
        i = args.index("--plot")
        plot = args[i + 1]
        del args[i:i + 2]
    records = rows(args[0] if args else
                   os.path.join(os.path.dirname(os.path.abspath(__file__)), "v4-runs.jsonl.gz"))
    print("Held-out EM of each method (18 worlds, final checkpoint, greedy)\n")
    print(means(records))
    print("\nEvery method against GRPO, paired by seed\n")
    print(table(records))
    print("\nEvery peer against EviSD, paired by seed\n")
    print(table(records, "evisd", METHODS[1:]))
    if plot:
        # GRPO first, then the methods in the protocol's order: the curves' line styles follow it
        order = ("grpo",) + METHODS
        records.sort(key=lambda r: (order.index(r["method"]), r["seed"]))
        print("wrote", curves.plot_curves(records, {r["run"]: r["metrics"] for r in records}, plot))
