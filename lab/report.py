"""The lab's report on trained runs: evaluate.py's held-out EM with what only the lab measures,
every measure paired by seed (``paired_differences``), as four tables; learning speed and curves
(lab/curves.py); the teacher's report card and gap view (lab/credit.py); one step's credit as a
page (lab/credit_page.py); and the power line
(``seeds_for``).

    python lab/report.py RUN_DIR... [--speed] [--plot PNG] [--credit [Q]] [--variants] [--rules]
                         [--show K] [--worlds N] [--validation] [--json F] [--baseline NAME]
                         [--device D] [--dtype T] [--credit-page HTML [--NAME=value ...]]

    python lab/report.py out/evisd-s0 out/grpo-s0 ...     # the four tables
    python lab/report.py out/* --speed --plot curves.png  # learning speed, paired too; curves
    python lab/report.py out/evisd-s0 --credit            # the teacher's report card
    python lab/report.py out/evisd-s0 --credit --variants --validation   # every design choice
    python lab/report.py out/evisd-s0 --credit --rules    # every credit rule on the same samples
    python lab/report.py out/evisd-s0 --show 3            # episodes with each action token's gap
    python lab/report.py out/fast --credit-page out/fast/credit.html   # one step's credit, a page

The tables: each run's EM per number of hops with its 95% interval; each method (runs named
``...-s<seed>``) as mean ± std over seeds; each method paired by seed against the baseline (the
GRPO runs, or ``--baseline``); and the summary, measures down and methods across. Held-out EM is
evaluate.py's, cached in each checkpoint's heldout-em.json, so a model is evaluated once. Beside EM
a row carries, over the last fifth of training (metrics.jsonl), the fraction of action tokens
EviSD modulated, the mean action-token gap where A > 0 and where A < 0, and the run's wall time.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import evaluate  # noqa: E402
import runs  # noqa: E402
from evaluate import HOPS, t_interval  # noqa: E402
from lab import credit, curves  # noqa: E402

# the columns of the per-method table, beside EM
LAB_COLUMNS = ("modulated_frac", "gap_pos", "gap_neg", "wall_min")
PAIRED_KEYS = ("macro", "hop1", "hop2")


def seeds_for(sd, half_width):
    """The fewest paired seeds n whose 95% t-interval, t_0.975(n-1) * sd / sqrt(n), is at most
    ``half_width`` at this sd: a protocol's power line solved the other way ("–" for sd 0)."""
    if not sd:
        return "–"
    n = 2
    while evaluate.t_975(n - 1) * sd / math.sqrt(n) > half_width:
        n += 1
    return n


def fmt_num(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def fmt_interval(m, lo, hi):
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" if lo is not None else f"{m:+.3f} (one seed)"


def paired_differences(rows, baseline=None, keys=PAIRED_KEYS):
    """Every group against the baseline group (the GRPO runs, unless named), seed by seed:
    {group: {"baseline", "seeds", "keys", "diff": {seed: {key: difference}}, "intervals": {key:
    (mean, low, high)}, "macro": (mean, low, high)}}, each interval the 95% t-interval of the
    mean paired difference over the seeds that have the measure."""
    if (baseline := evaluate.baseline_group(rows, baseline)) is None:
        return {}
    groups = {}
    for r in rows:
        groups.setdefault(r["group"], {})[r["seed"]] = r
    out = {}
    for name, by_seed in groups.items():
        seeds = sorted(set(by_seed) & set(groups[baseline]))
        if name == baseline or not seeds:
            continue
        # None where a run lacks the measure (real data has no hops, a run no habit left).
        diff = {s: {k: None if None in (by_seed[s].get(k), groups[baseline][s].get(k))
                    else by_seed[s][k] - groups[baseline][s][k] for k in keys} for s in seeds}
        intervals = {k: t_interval(vals) for k in keys
                     if (vals := [diff[s][k] for s in seeds if diff[s][k] is not None])}
        out[name] = {"baseline": baseline, "seeds": seeds, "keys": list(keys), "diff": diff,
                     "intervals": intervals, "macro": intervals.get("macro", (None, None, None))}
    return out


def em_key(cfg, worlds, validation=False, dtype=torch.float32):
    """The key of ``heldout-em.json``: what was scored, and in which dtype when not float32
    (bf16 may round a greedy choice the other way)."""
    scored = f"{worlds} worlds from {cfg['EVAL_SEED']}" if cfg["DATA"] == "toy" \
        else f"{cfg['DATA']} {cfg['DATA_DEV']}"
    return (scored + (" down (validation)" if validation else "")
            + ("" if dtype == torch.float32 else f" in {str(dtype).removeprefix('torch.')}"))


def cached_em(checkpoint, policy, tokenizer, cfg, worlds, validation=False, dtype=torch.float32):
    """``evaluate.heldout_by_hops``, kept in the checkpoint's ``heldout-em.json`` under ``em_key``:
    a checkpoint never changes, so each model is evaluated once, however many protocols read it
    (delete the file after changing the evaluation code)."""
    key, path = em_key(cfg, worlds, validation, dtype), os.path.join(checkpoint, "heldout-em.json")
    cache = json.load(open(path)) if os.path.exists(path) else {}
    if key not in cache:
        cache[key] = evaluate.heldout_by_hops(policy, tokenizer, cfg, worlds, validation, dtype)
        with open(path + ".tmp", "w") as f:
            json.dump(cache, f, indent=1)
        os.replace(path + ".tmp", path)
    return cache[key]


def cached_by_hops(policy, *args):
    """``cached_em`` in evaluate.run_summary's place of heldout_by_hops: the checkpoint is the
    directory the model was read from, which HF keeps as its ``name_or_path`` (a LoRA model's:
    its adapter's directory, as model.load_model names it; PEFT would pass on its base's)."""
    return cached_em(policy.name_or_path, policy, *args)


def lab_row(row, speed=False):
    """evaluate.run_summary's row with the lab's columns read off the run's metrics.jsonl, and
    with ``speed`` the learning-speed measures of lab/curves.py."""
    metrics = runs.read_metrics(row["run"])
    steps = [m for m in metrics if not m.get("eval")]
    last = steps[-max(1, len(steps) // 5):] if steps else []   # the last fifth of training

    def mean(keys):
        vals = [m[k] for m in last for k in keys if m.get(k) is not None]
        return sum(vals) / len(vals) if vals else None
    row = dict(row, modulated_frac=mean(["modulated_frac"]),
               gap_pos=mean(["search_gap_pos", "answer_gap_pos"]),   # action-token gap, A > 0
               gap_neg=mean(["search_gap_neg", "answer_gap_neg"]),   # and A < 0
               wall_min=sum(m["step_s"] for m in steps) / 60 if steps else None)
    return dict(row, **curves.speed(metrics, row["rl_steps"])) if speed else row


# ----------------------------------------------------------------------------- tables
def runs_table(rows):
    """One line per run: EM per hop with its 95% interval, the macro and the warm-up's."""
    lines = ["| run | seed | " + " | ".join(f"{h}-hop EM [95%]" for h in HOPS)
             + " | macro [95%] | warm-up macro |",
             "|---" * (len(HOPS) + 4) + "|"]
    for r in rows:
        cells = [f"{fmt_num(r[f'hop{h}'])} [{fmt_num(r[f'hop{h}_ci'][0])}, "
                 f"{fmt_num(r[f'hop{h}_ci'][1])}] (n={r[f'hop{h}_n']})"
                 for h in HOPS]
        ci = r.get("macro_ci") or [None, None]
        cells.append(f"{fmt_num(r.get('macro'))} [{fmt_num(ci[0])}, {fmt_num(ci[1])}]")
        lines.append(f"| {r['run']} | {r['seed']} | " + " | ".join(cells)
                     + f" | {fmt_num(r['warmup_macro'])} |")
    return "\n".join(lines)


def results_table(rows):
    """Rows grouped by method name: mean ± std over seeds for each column."""
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    cols = ["warmup_macro"] + [f"hop{h}" for h in HOPS] + ["macro", *LAB_COLUMNS]
    lines = ["| run | seeds | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for name, rs in groups.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in rs if r.get(c) is not None]
            if not vals:
                cells.append("–")
                continue
            t = torch.tensor(vals, dtype=torch.float64)
            cells.append(f"{t.mean().item():.3f} ± {t.std().item():.3f}" if len(vals) > 1
                         else f"{vals[0]:.3f}")
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table(paired):
    """Per seed, each measure's difference from the baseline; then each mean with its interval."""
    lines = []
    for name, p in paired.items():
        keys = list(p["intervals"])      # the measures with an interval, in the order paired
        lines += [f"{name} − {p['baseline']}, paired by seed:", "",
                  "| seed | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for s in p["seeds"]:
            lines.append(f"| {s} | " + " | ".join(fmt_num(p["diff"][s][k], "+.3f") for k in keys)
                         + " |")
        lines += (["", f"mean paired difference and 95% t-interval over {len(p['seeds'])} seeds "
                       f"(t with {len(p['seeds']) - 1} df):", ""]
                  + [f"- {k}: {fmt_interval(*p['intervals'][k])}" for k in keys] + [""])
    return "\n".join(lines)


def summary_table(rows, paired):
    """Measures down, groups across: the baseline's mean, and each group's paired difference
    from it with its 95% interval."""
    if not paired:
        return ""
    baseline = next(iter(paired.values()))["baseline"]
    base = [r for r in rows if r["group"] == baseline]
    lines = [f"| measure | {baseline} (mean of {len(base)}) | " +
             " | ".join(f"{g} − {baseline} [95%] (n={len(p['seeds'])})"
                        for g, p in paired.items()) + " |",
             "|---" * (len(paired) + 2) + "|"]
    measures = dict.fromkeys(k for p in paired.values() for k in p["intervals"])   # ordered union
    for k in measures:
        vals = [r[k] for r in base if r.get(k) is not None]
        cells = [fmt_interval(*p["intervals"][k]) if k in p["intervals"] else "–"
                 for p in paired.values()]
        lines.append(f"| {k} | {fmt_num(sum(vals) / len(vals) if vals else None)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv):
    ap = evaluate.arg_parser(__doc__)
    lab = ap.add_argument_group("the lab")
    lab.add_argument("--speed", action="store_true",
                     help="learning speed from metrics.jsonl, paired too (lab/curves.py)")
    lab.add_argument("--plot", nargs="?", const="curves.png", default=None, metavar="PNG",
                     help="learning curves PNG (lab/curves.py)")
    lab.add_argument("--credit", type=int, nargs="?", const=64, default=0, metavar="Q",
                     help="the teacher's report card on Q held-out questions, default 64 "
                          "(lab/credit.py)")
    lab.add_argument("--variants", action="store_true",
                     help="with --credit: score every EviSD design choice on the same samples")
    lab.add_argument("--rules", action="store_true",
                     help="with --credit: grade every credit rule (GRPO, EviSD, the peers') on "
                          "the same samples")
    lab.add_argument("--show", type=int, default=0, metavar="K",
                     help="print K example groups with each action token's gap (lab/credit.py)")
    lab.add_argument("--credit-page", metavar="HTML", default=None,
                     help="one RL step's credit, token by token, as a page (lab/credit_page.py); "
                          "train.py's --NAME=value after it adds the first run under those "
                          "settings as a column")
    # train.py's settings are left over for --credit-page; anything else is an error
    args, settings = ap.parse_known_args(argv)
    if settings and not args.credit_page:
        ap.error(f"unrecognized arguments: {' '.join(settings)}")
    if args.credit_page:
        if args.credit or args.show:
            raise SystemExit("--credit-page: one at a time with --credit and --show")
        from lab import credit_page
        return credit_page.write_page(args.runs, args.credit_page, settings)
    if args.credit < 0 or args.show < 0:
        raise SystemExit(f"--credit and --show must be >= 0, got {args.credit} and {args.show}")
    if (args.variants or args.rules) and not args.credit:
        raise SystemExit("--variants and --rules go with --credit")
    if args.variants and args.rules:
        raise SystemExit("--variants and --rules: one at a time")
    # The report card and the gap view sample episodes of their own: no held-out EM.
    if args.credit or args.show:
        return credit.main(args)
    rows = [lab_row(row, args.speed) for row in evaluate.evaluate_runs(args, cached_by_hops)]
    keys = PAIRED_KEYS + (curves.SPEED_KEYS if args.speed else ())
    paired = paired_differences(rows, args.baseline, keys)
    print(runs_table(rows), results_table(rows), paired_table(paired),
          summary_table(rows, paired), sep="\n\n")
    if real := [r for r in rows if "f1" in r]:
        from lab import real_data
        print("\n" + real_data.dev_table(real))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "paired": paired}, f, indent=1)
    if args.plot:
        metrics = {r["run"]: runs.read_metrics(r["run"]) for r in rows}
        print("wrote", curves.plot_curves(rows, metrics, args.plot))


if __name__ == "__main__":
    main(sys.argv[1:])
