"""Held-out evaluation: greedy EM by number of hops, and methods compared paired by seed.

    python evaluate.py out/evisd-s0 out/grpo-s0 ...   # EM per hop, 95% intervals; paired macro

Held-out worlds have seeds EVAL_SEED, EVAL_SEED + 1, ...; validation worlds (``--validation``,
for choosing settings) EVAL_SEED - 1, EVAL_SEED - 2, ...; train.py keeps every training world
below both. ``macro`` is the mean of 1- and 2-hop EM, the splits RL can move (3 hops is out of
distribution). Runs of one SEED share a warm-up, so methods are compared seed by seed. A
real-data run (train.py's DATA) is scored on its dev split by lab/real_data.py.
The lab's tables, power analysis, learning speed and report card: python lab/report.py.
"""
import argparse
import json
import math
import os
import random
import re
import sys

import torch
from tqdm import tqdm

import model
import rollout
import runs
import search_env
import toy_world

SPLITS = ("test", "ood")
HOPS = (1, 2, 3)             # 1 and 2 hops in `test`, 3 in `ood`
MACRO_HOPS = (1, 2)          # the headline: ood (3 hops) stays near 0 for every run
PAIRED_KEYS = ("macro", "hop1", "hop2")
EVAL_WORLDS = 9              # ~1,090 test and 1,080 ood questions; one world's ~121 give EM ± 0.09
EVAL_BATCH = 256             # questions per greedy rollout (a real dev split has thousands)


# ----------------------------------------------------------------------------- held-out EM
def eval_world_seed(cfg, k, validation=False):
    """The seed of held-out world EVAL_SEED + k, or of validation world EVAL_SEED - 1 - k."""
    return cfg["EVAL_SEED"] - 1 - k if validation else cfg["EVAL_SEED"] + k


def real_data(cfg):
    """The lab's switch for real data (DATA other than "toy"); None for the toy world."""
    return runs.lab("real_data", f"DATA={cfg['DATA']!r}") if cfg["DATA"] != "toy" else None


def heldout_questions(cfg, split, n, world_index=0, validation=False):
    """n questions of a split of held-out (or validation) world ``world_index``, a fixed sample."""
    seed = eval_world_seed(cfg, world_index, validation)
    world = toy_world.make_world(seed, scale=cfg["WORLD_SCALE"])
    qs = world.split(split)
    return world, random.Random(seed).sample(qs, min(n, len(qs)))


@torch.no_grad()
def greedy_episodes(policy, tokenizer, cfg, world, questions, dtype=torch.float32):
    """Greedy exact match of each question [len(questions)] and its answers."""
    device = next(policy.parameters()).device
    em, answers = [], []
    for c in range(0, len(questions), EVAL_BATCH):
        envs = search_env.episodes(world, questions[c:c + EVAL_BATCH], 1, cfg["MAX_TURNS"],
                                   cfg["TOP_K"])
        with model.autocast(device, dtype):
            r = rollout.rollout(policy, tokenizer, envs, cfg["MAX_NEW_TOKENS"], greedy=True)
        em, answers = em + [r.em], answers + r.answers
    return torch.cat(em), answers


def heldout_em(policy, tokenizer, cfg, n=100, dtype=torch.float32):
    """The quick check during training: greedy EM on ``n`` questions of each split of the first
    held-out world, per split, per number of hops, and the macro (None when the sample lacks a
    hop). Real data: dev EM and F1 (lab/real_data.py)."""
    if real := real_data(cfg):
        return real.quick_scores(policy, tokenizer, cfg, n, dtype)
    out, by_hops = {}, {h: [] for h in HOPS}
    for split in SPLITS:
        world, qs = heldout_questions(cfg, split, n)
        ems = greedy_episodes(policy, tokenizer, cfg, world, qs, dtype)[0].tolist()
        out[split] = round(sum(ems) / len(ems), 4)
        for q, em in zip(qs, ems):
            by_hops[q.hops].append(em)
    for h in HOPS:
        out[f"hop{h}"] = round(sum(by_hops[h]) / len(by_hops[h]), 4) if by_hops[h] else None
    ems = [out[f"hop{h}"] for h in MACRO_HOPS]
    return dict(out, macro=None if None in ems else round(sum(ems) / len(ems), 4))


def heldout_by_hops(policy, tokenizer, cfg, worlds=EVAL_WORLDS, validation=False,
                    dtype=torch.float32):
    """Greedy EM on every question of ``worlds`` held-out (or validation) worlds per number of
    hops, each with its 95% Wilson interval, and the macro with a normal interval. Real data:
    its whole dev split (lab/real_data.py)."""
    if real := real_data(cfg):
        return real.dev_scores(policy, tokenizer, cfg, dtype=dtype, validation=validation)
    correct, total = {h: 0 for h in HOPS}, {h: 0 for h in HOPS}
    for k in range(worlds):
        world = toy_world.make_world(eval_world_seed(cfg, k, validation), scale=cfg["WORLD_SCALE"])
        qs = [q for split in SPLITS for q in world.split(split)]
        for q, r in zip(qs, greedy_episodes(policy, tokenizer, cfg, world, qs, dtype)[0].tolist()):
            correct[q.hops], total[q.hops] = correct[q.hops] + r, total[q.hops] + 1
    out = {}
    for h in HOPS:
        out[f"hop{h}"], out[f"hop{h}_n"] = correct[h] / total[h] if total[h] else None, total[h]
        out[f"hop{h}_ci"] = list(wilson(correct[h], total[h])) if total[h] else [None, None]
    ems = [out[f"hop{h}"] for h in MACRO_HOPS]
    if None not in ems:
        se = math.sqrt(sum(p * (1 - p) / total[h] for p, h in zip(ems, MACRO_HOPS))) / len(ems)
        out["macro"] = sum(ems) / len(ems)
        out["macro_ci"] = [out["macro"] - 1.96 * se, out["macro"] + 1.96 * se]
    return out


# ----------------------------------------------------------------------------- intervals
def wilson(successes, n, z=1.96):
    """The Wilson score interval of a binomial proportion (sensible at 0 and 1, unlike
    p ± z·se)."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


# Two-sided 95% quantiles of Student's t (t_0.975) for 1..30 degrees of freedom.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_975(dof):
    """Student's t_0.975 for ``dof`` degrees of freedom; beyond 30, the normal 1.96 (< 3% off)."""
    return T_975[dof - 1] if dof <= len(T_975) else 1.96


def t_interval(values):
    """(mean, low, high): the 95% t-interval of the mean, mean ± t_0.975(n−1)·s/√n."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, None, None
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    t = t_975(n - 1)
    return m, m - t * s / math.sqrt(n), m + t * s / math.sqrt(n)


def paired_differences(rows, baseline=None, keys=PAIRED_KEYS):
    """Every group against the baseline group (the GRPO runs, unless named), seed by seed:
    {group: {"baseline", "seeds", "keys", "diff": {seed: {key: difference}}, "intervals": {key:
    (mean, low, high)}, "macro": (mean, low, high)}}, each interval the 95% t-interval of the
    mean paired difference over the seeds that have the measure."""
    groups = {}
    for r in rows:
        groups.setdefault(r["group"], {})[r["seed"]] = r
    if baseline is None:
        grpo_groups = sorted({r["group"] for r in rows if r["method"] == "grpo"})
        if len(grpo_groups) != 1:
            return {}       # nothing to pair with, or ambiguous: --baseline names it
        baseline = grpo_groups[0]
    if baseline not in groups:
        raise SystemExit(f"--baseline {baseline!r}: no such run group; have {', '.join(groups)}")
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


def fmt_num(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def fmt_interval(m, lo, hi):
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" if lo is not None else f"{m:+.3f} (one seed)"


# ----------------------------------------------------------------------------- runs
def group_name(run_dir):
    return re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(run_dir)))


def run_summary(run_dir, args, warmup_em, score=heldout_by_hops):
    """One run's row: its held-out EM (``score``: heldout_by_hops, or lab/report.py's cache of it)
    and its warm-up's macro (``warmup_em``, shared: the runs of a seed share a warm-up), on the
    run's DEVICE and DTYPE unless ``args`` name others, as its quick checks were computed."""
    policy, tokenizer, cfg, sft_path = runs.load_run(run_dir)
    device = torch.device(args.device or cfg["DEVICE"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"this run computed on {device}, and torch sees no CUDA device here: "
                         "pass --device cpu (and --dtype float32 for the CPU's fastest path)")
    dtype = getattr(torch, args.dtype or cfg["DTYPE"])   # train.py refuses float16
    em = score(policy.to(device), tokenizer, cfg, args.worlds, args.validation, dtype)
    if sft_path and os.path.isdir(sft_path) and sft_path not in warmup_em:
        warmed = model.load_model(sft_path, local_files_only=True)[0].eval().to(device)
        warmup_em[sft_path] = score(warmed, tokenizer, cfg, args.worlds, args.validation,
                                    dtype).get("macro")
    return {"run": run_dir, "group": group_name(run_dir), "seed": cfg["SEED"],
            "method": cfg["METHOD"], "rl_steps": cfg["RL_STEPS"],
            "warmup_macro": warmup_em.get(sft_path), **em}


def evaluate_runs(args, score=heldout_by_hops):
    """run_summary of every run of ``args`` (main's flags), each warm-up evaluated once."""
    if missing := [run for run in args.runs if not os.path.isdir(run)]:
        raise SystemExit(f"no such run directory: {', '.join(missing)}")
    if args.worlds < 1:
        raise SystemExit(f"--worlds must be >= 1, got {args.worlds}")
    warmup_em = {}
    return [run_summary(run, args, warmup_em, score)
            for run in tqdm(args.runs, desc="evaluate", dynamic_ncols=True)]


def arg_parser(doc=__doc__):
    """evaluate.py's flags; lab/report.py adds its own."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (train.py's OUT_DIR) or checkpoints")
    ap.add_argument("--worlds", type=int, default=EVAL_WORLDS, help="held-out worlds to play")
    ap.add_argument("--validation", action="store_true",
                    help="validation worlds instead of held-out ones (for choosing settings)")
    ap.add_argument("--baseline", default=None, help="run group to pair against (default: GRPO)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--device", default=None, help="default: the run's DEVICE (cpu, cuda, ...)")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                    help="default: the run's DTYPE")
    return ap


def main(argv):
    args = arg_parser().parse_args(argv)
    rows = evaluate_runs(args)
    paired = paired_differences(rows, args.baseline)
    for r in rows:
        print(f"{r['run']} (seed {r['seed']}, {r['method']}; warm-up macro "
              f"{fmt_num(r['warmup_macro'])}): EM [95%]")
        for key in [f"hop{h}" for h in HOPS] + ["macro", "f1"]:
            if r.get(key) is not None:   # real data has F1 and maybe no hops, toy no F1
                (lo, hi), n = r[key + "_ci"], f" (n={r[key + '_n']})" if key + "_n" in r else ""
                print(f"  {key:5} {r[key]:.3f} [{lo:.3f}, {hi:.3f}]{n}")
    for name, p in paired.items():
        print(f"{name} − {p['baseline']}, paired by seed (n={len(p['seeds'])}): macro EM "
              + (fmt_interval(*p["macro"]) if p["macro"][0] is not None else "–"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "paired": paired}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
