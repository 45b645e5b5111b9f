"""Benchmark v5's tables from the runs' records alone (lab/results/v5-runs.jsonl.gz, read by
lab/packs.py), so they can be rebuilt on any machine, checkpoints or not, and read while
protocol-v5.sh still runs.

    python lab/results/v5_tables.py [lab/results/v5-runs.jsonl.gz] [--plot curves-v5.png]
    python lab/results/v5_tables.py --collect out/v5    # pack finished runs' records first

Tables, as protocol-v5.sh fixes them: the headline, EviSD - GRPO over every seed that has both;
the paper's ablation table with our column, each row and dose against EviSD on the seeds both
have (and against GRPO), the paired mean difference of held-out macro EM with its 95% t-interval
(report.paired_differences), the sd, the half-width reached, the protocol's decision, and
whether the paper's figure (points / 100) lies inside; each group's own EM; learning speed
(lab/curves.py). Runs missing from the records are listed. Trains and evaluates nothing.
"""
import glob
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lab import curves, report  # noqa: E402
from lab import packs  # noqa: E402

WORLDS = 18          # protocol-v5.sh's EVAL_WORLDS_V5
HEADLINE_SEEDS = range(30)
ROW_SEEDS = range(10)
# (group, what it changes, override, the paper's figure in macro EM points; None: not in it)
ROWS = [("evisd-response", "whole-response modulation", "--EVISD_SPAN=response", -7.1),
        ("evisd-gated-loss", "a response-wide gated loss", "--EVISD_FORM=gated_loss", -5.8),
        ("evisd-answer-only", "answer-only privilege", "--USE_SEARCH_EVIDENCE=False", -2.1),
        ("evisd-shared", "one shared context", "--TEACHER_CONTEXT=shared", -0.2),
        ("evisd-lam0.5", "λ = 0.5 (the dose)", "--EVISD_LAMBDA=0.5", None),
        ("evisd-lam0.9", "λ = 0.9 (the dose)", "--EVISD_LAMBDA=0.9", None)]
GROUPS = ["grpo", "evisd"] + [r[0] for r in ROWS]


def rows(path):
    """One row per run of the protocol whose held-out EM (18 worlds) is recorded in the pack at
    ``path``."""
    out = []
    for run in packs.run_records(path):
        cfg = run["config"]
        em = run.get("heldout_em", {}).get(report.em_key(cfg, WORLDS))
        if em is None:
            continue
        metrics = packs.metrics(run, path)
        out.append({"run": run["name"], "metrics": metrics,
                    "group": re.sub(r"-s\d+$", "", run["name"]),   # evisd-s3: evisd
                    "method": cfg["METHOD"], "seed": cfg["SEED"],
                    **{k: em.get(k) for k in ("macro", "hop1", "hop2", "hop3")},
                    **curves.speed(metrics, cfg["RL_STEPS"])})
    return out


def collect(source, path):
    """Pack each finished run's records (config.json, metrics.jsonl, the final checkpoint's
    heldout-em.json) from protocol-v5.sh's ``source`` (out/v5) into the pack at ``path``, each
    in place of the record of the same name."""
    found = []
    for d in sorted(glob.glob(os.path.join(source, "*-s[0-9]*"))):
        em = os.path.join(d, "ckpt-000060", "heldout-em.json")
        if os.path.exists(em):
            found.append(packs.record(d, heldout_em=em))
    packs.add(path, found)
    print(f"{len(found)} finished runs' records packed from {source} into {path}")


def missing(records):
    """The protocol's runs that have no record yet."""
    have = {(r["group"], r["seed"]) for r in records}
    planned = [(g, s) for g in ("grpo", "evisd") for s in HEADLINE_SEEDS]
    planned += [(g, s) for g, *_ in ROWS for s in ROW_SEEDS]
    return [f"{g}-s{s}" for g, s in planned if (g, s) not in have]


def decide(mean, low, high):
    if low is None:
        return "one seed"
    if low > 0:
        return "helps"
    if high < 0:
        return "hurts"
    return "no difference detected"


def paired_line(p, key="macro"):
    """(cells of the macro comparison: mean [95%], sd, half-width, seeds for ±0.008 and the
    decision) of one report.paired_differences entry."""
    mean, low, high = p["intervals"][key]
    diffs = [p["diff"][s][key] for s in p["seeds"] if p["diff"][s][key] is not None]
    sd = statistics.stdev(diffs) if len(diffs) > 1 else None
    half = (high - low) / 2 if low is not None else None
    return mean, low, high, sd, half


def fmt_interval(mean, low, high):
    return report.fmt_interval(mean, low, high)


def headline(records):
    """EviSD - GRPO over every seed that has both."""
    keys = report.PAIRED_KEYS + ("hop3",) + curves.SPEED_KEYS   # 3-hop: the protocol's "also"
    p = report.paired_differences(records, "grpo", keys).get("evisd")
    if not p:
        return "no seed has both GRPO and EviSD yet"
    mean, low, high, sd, half = paired_line(p)
    need = report.seeds_for(sd, 0.008)
    lines = [f"EviSD − GRPO, held-out macro EM, {len(p['seeds'])} seeds: "
             f"{fmt_interval(mean, low, high)} → **{decide(mean, low, high)}**; paired sd "
             f"{_f(sd)}, half-width reached {_f(half)} (±0.008 would need about {need} seeds at "
             f"this sd).", "",
             "| measure | EviSD − GRPO [95%] |", "|---|---|"]
    for k in keys:
        if k in p["intervals"]:
            lines.append(f"| {k} | {fmt_interval(*p['intervals'][k])} |")
    return "\n".join(lines)


def other_measures(records):
    """Each row and dose against EviSD on the protocol's other measures: 1-, 2- and 3-hop EM and
    the learning speed the default toy still shows (the quick check's area, the premature
    answers' area), paired by seed, mean [95%]."""
    keys = ("hop1", "hop2", "hop3", "quick_area", "premature_area")
    mine = [r for r in records if r["seed"] in set(ROW_SEEDS)]
    vs_evisd = report.paired_differences(mine, "evisd", keys)
    lines = ["| − EviSD [95%] | seeds | " + " | ".join(keys) + " |",
             "|---" * (len(keys) + 2) + "|"]
    for group, what, *_ in ROWS:
        p = vs_evisd.get(group)
        if p:
            lines.append(f"| {what} | {len(p['seeds'])} | " + " | ".join(
                fmt_interval(*p["intervals"][k]) if k in p["intervals"] else "–" for k in keys)
                + " |")
    return "\n".join(lines)


def points(mean, low, high):
    """A paired difference in EM points (x 100, as the paper's table), with its 95% interval."""
    cell = "{:+.1f} [{:+.1f}, {:+.1f}]".format(100 * mean, 100 * low, 100 * high)
    return cell.replace("-", "−")


def readme_cells(records):
    """The README's column beside the paper's: for each override, our paired difference in EM
    points with its interval, in bold with the decision where the interval excludes 0 (rows:
    - EviSD on seeds 0-9; the default: EviSD - GRPO on every seed, their number given).
    lab/tests/test_v5_tables.py checks the README against these."""
    def cell(p, better, worse):
        verdict = decide(*p["macro"])
        if verdict == "no difference detected":
            return points(*p["macro"])
        return f"**{points(*p['macro'])} {better if verdict == 'helps' else worse}**"

    seeds = set(ROW_SEEDS)
    vs_evisd = report.paired_differences([r for r in records if r["seed"] in seeds], "evisd")
    cells = {}
    p = report.paired_differences(records, "grpo").get("evisd")
    if p:
        cells["(the default)"] = (f"− GRPO: {cell(p, 'helps', 'hurts')} "
                                  f"({len(p['seeds'])} seeds)")
    for group, what, override, paper in ROWS:
        if group in vs_evisd:
            cells[override] = cell(vs_evisd[group], "better", "worse")
    return cells


def _f(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def ablation(records):
    """The paper's ablation table with our column: each row and dose against EviSD (and against
    GRPO), paired by seed, on the seeds both have."""
    seeds = set(ROW_SEEDS)
    mine = [r for r in records if r["seed"] in seeds]
    vs_evisd = report.paired_differences(mine, "evisd")
    vs_grpo = report.paired_differences(mine, "grpo")
    lines = ["| the paper's row | override | paper (7B, one run) | seeds | ours: − EviSD, macro "
             "[95%] | sd | half-width | seeds for ±0.015 | decision | paper inside? | "
             "ours: − GRPO [95%] |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    evisd_grpo = vs_grpo.get("evisd")
    if evisd_grpo:
        m, lo, hi, sd, half = paired_line(evisd_grpo)
        lines.append(f"| EviSD | (the default) | 50.8 | {len(evisd_grpo['seeds'])} | 0 | – | – | – "
                     f"| – | – | {fmt_interval(m, lo, hi)} |")
    for group, what, override, paper in ROWS:
        p = vs_evisd.get(group)
        if not p:
            lines.append(f"| {what} | `{override}` | {_f(paper, '+.1f')} | 0 | not run yet | | | "
                         "| | | |")
            continue
        m, lo, hi, sd, half = paired_line(p)
        inside = ("–" if paper is None or lo is None
                  else "yes" if lo <= paper / 100 <= hi else "no")
        g = vs_grpo.get(group)
        lines.append(f"| {what} | `{override}` | {_f(paper, '+.1f')} | {len(p['seeds'])} | "
                     f"{fmt_interval(m, lo, hi)} | {_f(sd)} | {_f(half)} | "
                     f"{report.seeds_for(sd, 0.015)} | "
                     f"{decide(m, lo, hi).replace('helps', 'better').replace('hurts', 'worse')}"
                     f" | {inside} | {fmt_interval(*g['intervals']['macro']) if g else '–'} |")
    return "\n".join(lines)


def means(records):
    """Each group's own held-out EM, averaged over its seeds."""
    lines = ["| run group | seeds | macro | 1-hop | 2-hop | 3-hop |", "|---|---|---|---|---|---|"]
    for g in GROUPS:
        mine = [r for r in records if r["group"] == g]
        if mine:
            avg = {k: statistics.mean(r[k] for r in mine)
                   for k in ("macro", "hop1", "hop2", "hop3")}
            lines.append(f"| {g} | {len(mine)} | {avg['macro']:.3f} | {avg['hop1']:.3f} | "
                         f"{avg['hop2']:.3f} | {avg['hop3']:.3f} |")
    return "\n".join(lines)


def mechanics(records):
    """What each group's training did, averaged over its RL steps and seeds (metrics.jsonl):
    the share of generated tokens whose advantage the rule moved, the mean |gap| on search and
    answer tokens, the gated loss's term beside the size of the whole loss, the KL to the
    warm-up and the reward."""
    keys = ("modulated_frac", "search_gap_abs_mean", "answer_gap_abs_mean", "extra_loss",
            "loss", "kl", "reward")
    lines = ["| run group | " + " | ".join(k if k != "loss" else "\\|loss\\|" for k in keys)
             + " |", "|---" * (len(keys) + 1) + "|"]
    for g in GROUPS:
        steps = [m for r in records if r["group"] == g for m in r["metrics"] if not m.get("eval")]
        if steps:
            cells = []
            for k in keys:
                vals = [abs(m[k]) if k == "loss" else m[k] for m in steps
                        if m.get(k) is not None]
                cells.append(_f(statistics.mean(vals), ".2g") if vals else "–")
            lines.append(f"| {g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed(records):
    """Held-out macro EM of every run, one line per seed."""
    by = {(r["group"], r["seed"]): r["macro"] for r in records}
    seeds = sorted({r["seed"] for r in records})
    lines = ["| seed | " + " | ".join(GROUPS) + " |", "|---" * (len(GROUPS) + 1) + "|"]
    for s in seeds:
        lines.append(f"| {s} | " + " | ".join(_f(by.get((g, s))) for g in GROUPS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    plot = None
    if "--plot" in args:
        i = args.index("--plot")
        plot = args[i + 1]
        del args[i:i + 2]
    source = None
    if "--collect" in args:
        i = args.index("--collect")
        source = args[i + 1]
        del args[i:i + 2]
    path = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             "v5-runs.jsonl.gz")
    if source:
        collect(source, path)
    records = rows(path)
    print("## Headline\n\n" + headline(records))
    print("\n## The paper's ablation table, with intervals (seeds 0–9)\n\n" + ablation(records))
    print("\n## Each row against EviSD on the other measures (seeds 0–9)\n\n"
          + other_measures(records))
    print("\n## Each run group's own held-out EM (18 worlds, final checkpoint, greedy)\n\n"
          + means(records))
    # Over the rows' seeds, so that every group's training is read on the same ten seeds.
    print("\n## What each group's training did (seeds 0–9, mean over RL steps)\n\n"
          + mechanics([r for r in records if r["seed"] in ROW_SEEDS]))
    print("\n## The README's column (EM points)\n")
    for override, cell in readme_cells(records).items():
        print(f"{override}: {cell}")
    print("\n## Held-out macro EM per seed\n\n" + per_seed(records))
    gone = missing(records)
    print(f"\n{len(records)} runs recorded; {len(gone)} of the protocol's runs not yet"
          + (": " + ", ".join(gone) if 0 < len(gone) <= 40 else ""))
    if plot:
        order = GROUPS
        records.sort(key=lambda r: (order.index(r["group"]), r["seed"]))
        print("wrote", curves.plot_curves(records, {r["run"]: r["metrics"] for r in records}, plot))
