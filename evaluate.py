"""Held-out evaluation: greedy EM by number of hops, and methods compared paired by seed.

    python evaluate.py out/evisd-s0 out/grpo-s0 ...   # EM per hop, 95% intervals; paired macro

Held-out worlds are seeds EVAL_SEED and up, validation worlds (``--validation``) the ones below;
``macro`` is the mean of 1- and 2-hop EM, what RL can move. The lab's tables: lab/report.py."""
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
EVAL_WORLDS = 9              # held-out worlds of ~240 questions each (why 9: docs/design-notes.md)
EVAL_BATCH = 256             # questions per greedy rollout (a real dev split has thousands)


# ----------------------------------------------------------------------------- held-out EM
def eval_world_seed(cfg, k, validation=False):
    return cfg["EVAL_SEED"] - 1 - k if validation else cfg["EVAL_SEED"] + k


def real_data(cfg):
    """The lab's switch for real data (DATA other than "toy"); None for the toy world."""
    return runs.lab("real_data", f"DATA={cfg['DATA']!r}") if cfg["DATA"] != "toy" else None


def heldout_questions(cfg, split, n, world_index=0, validation=False):
    """A fixed sample of n questions of a split of world ``world_index`` (held-out or not)."""
    seed = eval_world_seed(cfg, world_index, validation)
    world = toy_world.make_world(seed, scale=cfg["WORLD_SCALE"])
    qs = world.split(split)
    return world, random.Random(seed).sample(qs, min(n, len(qs)))


@torch.no_grad()
def greedy_episodes(policy, tokenizer, cfg, world, questions, dtype=torch.float32):
    """Greedy exact match of each question [len(questions)] and its answers."""
    em, answers = [], []
    for c in range(0, len(questions), EVAL_BATCH):
        envs = search_env.episodes(world, questions[c:c + EVAL_BATCH], 1, cfg["MAX_TURNS"],
                                   cfg["TOP_K"])
        with model.autocast(next(policy.parameters()).device, dtype):
            r = rollout.rollout(policy, tokenizer, envs, cfg["MAX_NEW_TOKENS"], greedy=True)
        em, answers = em + [r.em], answers + r.answers
    return torch.cat(em), answers


def heldout_em(policy, tokenizer, cfg, n=100, dtype=torch.float32):
    """Training's quick check: greedy EM on ``n`` questions per split of held-out world 0."""
    if real := real_data(cfg):
        return real.quick_scores(policy, tokenizer, cfg, n, dtype)
    out, by_hops = {}, {h: [] for h in HOPS}
    for split in SPLITS:
        world, qs = heldout_questions(cfg, split, n)
        correct = greedy_episodes(policy, tokenizer, cfg, world, qs, dtype)[0].tolist()
        out[split] = round(sum(correct) / len(correct), 4)
        for q, em in zip(qs, correct):
            by_hops[q.hops].append(em)
    out.update({f"hop{h}": round(sum(v) / len(v), 4) if v else None for h, v in by_hops.items()})
    ems = [out[f"hop{h}"] for h in MACRO_HOPS]
    return dict(out, macro=None if None in ems else round(sum(ems) / len(ems), 4))


def heldout_by_hops(policy, tokenizer, cfg, worlds=EVAL_WORLDS, validation=False,
                    dtype=torch.float32):
    """Greedy EM by hops on all of ``worlds`` held-out (or validation) worlds, 95% intervals."""
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
    """The Wilson score interval of a proportion (sensible at 0 and 1, unlike p ± z·se)."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def t_975(dof):
    """Student's t_0.975 for ``dof`` degrees of freedom; beyond 30, the normal 1.96 (< 3% off)."""
    table = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
             2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
             2.060, 2.056, 2.052, 2.048, 2.045, 2.042)                     # dof = 1, ..., 30
    return table[dof - 1] if dof <= len(table) else 1.96


def t_interval(values):
    """(mean, low, high): the 95% t-interval of the mean, mean ± t_0.975(n−1)·s/√n."""
    n, m = len(values), sum(values) / len(values)
    if n < 2:
        return m, None, None
    half = t_975(n - 1) * math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)
    return m, m - half, m + half


def baseline_group(rows, baseline=None):
    """The run group the others are paired with: ``baseline``, else the one GRPO group (None
    where there is none, or several: --baseline names it)."""
    groups = list(dict.fromkeys(r["group"] for r in rows))
    if baseline is not None and baseline not in groups:
        raise SystemExit(f"--baseline {baseline!r}: no such run group; have {', '.join(groups)}")
    grpo = sorted({r["group"] for r in rows if r["method"] == "grpo"})
    return baseline or (grpo[0] if len(grpo) == 1 else None)


def paired_macro(rows, baseline=None):
    """Each run group's macro EM minus the baseline group's, seed by seed: {group: {"baseline",
    "seeds", "diff": {seed: difference}, "macro": (mean, low, high)}}."""
    if (baseline := baseline_group(rows, baseline)) is None:
        return {}
    base = {r["seed"]: r.get("macro") for r in rows if r["group"] == baseline}
    diffs = {r["group"]: {} for r in rows if r["group"] != baseline}
    for r in sorted(rows, key=lambda r: r["seed"]):   # a run without a macro is left out
        if r["group"] != baseline and None not in (r.get("macro"), base.get(r["seed"])):
            diffs[r["group"]][r["seed"]] = r["macro"] - base[r["seed"]]
    return {g: {"baseline": baseline, "seeds": list(d), "diff": d,
                "macro": t_interval(list(d.values()))} for g, d in diffs.items() if d}


# ----------------------------------------------------------------------------- runs
def run_summary(run_dir, args, warmup_em, score=heldout_by_hops):
    """One run's held-out EM by ``score`` and its warm-up's macro (``warmup_em``: a seed's)."""
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
    group = re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(run_dir)))   # evisd-s3: evisd
    return {"run": run_dir, "group": group, "seed": cfg["SEED"],
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
    ap.add_argument("--baseline", help="run group to pair against (default: GRPO)")
    ap.add_argument("--json", help="also write the results as JSON here")
    ap.add_argument("--device", help="default: the run's DEVICE (cpu, cuda, ...)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: the run's DTYPE")
    return ap


def main(argv):
    args = arg_parser().parse_args(argv)
    rows = evaluate_runs(args)
    paired = paired_macro(rows, args.baseline)
    for r in rows:
        warm = "–" if r["warmup_macro"] is None else f"{r['warmup_macro']:.3f}"
        print(f"{r['run']} (seed {r['seed']}, {r['method']}; warm-up macro {warm}): EM [95%]")
        for key in [f"hop{h}" for h in HOPS] + ["macro", "f1"]:
            if r.get(key) is not None:   # real data has F1 and maybe no hops, toy no F1
                (lo, hi), n = r[key + "_ci"], f" (n={r[key + '_n']})" if key + "_n" in r else ""
                print(f"  {key:5} {r[key]:.3f} [{lo:.3f}, {hi:.3f}]{n}")
    for name, p in paired.items():
        m, lo, hi = p["macro"]
        ci = f"[{lo:+.3f}, {hi:+.3f}]" if lo is not None else "(one seed)"
        print(f"{name} − {p['baseline']}, paired by seed (n={len(p['seeds'])}): macro EM "
              f"{m:+.3f} {ci}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "paired": paired}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
