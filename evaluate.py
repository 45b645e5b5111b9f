"""Held-out evaluation: greedy EM per number of hops over several held-out worlds, and paired
comparisons of methods, seed by seed, with 95% intervals.

    python evaluate.py out/evisd-s0 out/grpo-s0 ...   # EM per hop with 95% intervals; paired table

The lab adds, each switched on by its flag (lab/README.md):

    python evaluate.py out/* --speed --plot curves.png  # learning speed and curves (lab/curves.py)
    python evaluate.py out/evisd-s0 --credit          # the teacher's report card (lab/credit.py)
    python evaluate.py out/evisd-s0 --show 3          # episodes with the teacher-student gap

Each run is evaluated on the DEVICE and DTYPE it trained with (``--device``, ``--dtype`` pick
others). Held-out worlds have seeds EVAL_SEED, EVAL_SEED + 1, ...; validation worlds (for choosing
settings) EVAL_SEED - 1, EVAL_SEED - 2, ...; train.py keeps every training world below both.
Each world gives ~121 `test` questions (1 and 2 hops, over entities no train
question starts from) and 120 `ood` ones (3 hops); the headline ``macro`` is the mean of the
1-hop and 2-hop EM, the splits RL can move. Runs whose names differ only in a trailing
``-s<seed>`` are aggregated as mean ± std; runs of different methods with the same SEED share a
warm-up and are compared paired, seed by seed, against the GRPO runs.
A real-data run (train.py's DATA) is scored by lab/real_data.py on its dev split: EM (its
macro) and answer F1, with intervals.
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
EVAL_WORLDS = 9              # ~1,090 test and 1,080 ood questions; one world's ~121 give EM ± 0.09
# questions per greedy rollout (a toy world has ~241, a real dev split thousands)
EVAL_BATCH = 256


# ----------------------------------------------------------------------------- held-out questions
def eval_world_seed(cfg, world_index, validation=False):
    """The seed of held-out world ``EVAL_SEED + world_index``, or, with ``validation``, of
    validation world ``EVAL_SEED - 1 - world_index``, where settings may be chosen without
    looking at the held-out worlds."""
    return cfg["EVAL_SEED"] - 1 - world_index if validation else cfg["EVAL_SEED"] + world_index


def real_data(cfg):
    """The lab's switch for real data (DATA other than "toy"): lab/real_data.py scores its dev
    split. None for the toy world."""
    return runs.lab("real_data", f"DATA={cfg['DATA']!r}") if cfg["DATA"] != "toy" else None


def heldout_questions(cfg, split, n, world_index=0, validation=False):
    """n questions of a split of held-out (or validation) world ``world_index``, a fixed sample."""
    seed = eval_world_seed(cfg, world_index, validation)
    world = toy_world.make_world(seed, scale=cfg["WORLD_SCALE"])
    qs = world.split(split)
    qs = random.Random(seed).sample(qs, min(n, len(qs)))
    return world, qs


@torch.no_grad()
def greedy_episodes(policy, tokenizer, cfg, world, questions, dtype=torch.float32):
    """Greedy exact match of each question [len(questions)] and its answers, EVAL_BATCH at a
    time."""
    device = next(policy.parameters()).device
    rewards, answers = [], []
    for c in range(0, len(questions), EVAL_BATCH):
        envs = search_env.episodes(world, questions[c:c + EVAL_BATCH], 1, cfg["MAX_TURNS"],
                                   cfg["TOP_K"])
        with model.autocast(device, dtype):
            r = rollout.rollout(policy, tokenizer, envs, cfg["MAX_NEW_TOKENS"], greedy=True)
        rewards, answers = rewards + [r.rewards], answers + r.answers
    return torch.cat(rewards), answers


def heldout_em(policy, tokenizer, cfg, n=100, dtype=torch.float32):
    """The quick check during training: greedy EM on ``n`` questions of each split of the first
    held-out world, per split and per number of hops, and the macro, the mean of 1- and 2-hop EM
    as in the held-out table (None when the sample lacks one of them). Real data: dev EM and F1
    (lab/real_data.py)."""
    real = real_data(cfg)
    if real:
        return real.quick_scores(policy, tokenizer, cfg, n, dtype)
    out, by_hops = {}, {h: [] for h in HOPS}
    for split in SPLITS:
        world, qs = heldout_questions(cfg, split, n)
        rewards = greedy_episodes(policy, tokenizer, cfg, world, qs, dtype)[0].tolist()
        out[split] = round(sum(rewards) / len(rewards), 4)
        for q, r in zip(qs, rewards):
            by_hops[q.hops].append(r)
    for h in HOPS:
        out[f"hop{h}"] = round(sum(by_hops[h]) / len(by_hops[h]), 4) if by_hops[h] else None
    ems = [out[f"hop{h}"] for h in MACRO_HOPS]
    out["macro"] = None if None in ems else round(sum(ems) / len(ems), 4)
    return out


def heldout_by_hops(policy, tokenizer, cfg, worlds=EVAL_WORLDS, validation=False,
                    dtype=torch.float32):
    """Greedy EM on every `test` and `ood` question of ``worlds`` held-out (or validation)
    worlds, per number of hops, each with its 95% Wilson interval, and the macro over
    ``MACRO_HOPS`` (with a normal-approximation interval), computed in ``dtype`` on the policy's
    device. Real data: its whole dev split (lab/real_data.py)."""
    real = real_data(cfg)
    if real:
        return real.dev_scores(policy, tokenizer, cfg, dtype=dtype, validation=validation)
    correct, total = {h: 0 for h in HOPS}, {h: 0 for h in HOPS}
    for k in range(worlds):
        world = toy_world.make_world(eval_world_seed(cfg, k, validation), scale=cfg["WORLD_SCALE"])
        qs = [q for split in SPLITS for q in world.split(split)]
        em = greedy_episodes(policy, tokenizer, cfg, world, qs, dtype)[0].tolist()
        for q, r in zip(qs, em):
            correct[q.hops] += r
            total[q.hops] += 1
    out = {}
    for h in HOPS:
        em = correct[h] / total[h] if total[h] else None
        lo, hi = wilson(correct[h], total[h]) if total[h] else (None, None)
        out[f"hop{h}"], out[f"hop{h}_n"], out[f"hop{h}_ci"] = em, total[h], [lo, hi]
    ems = [out[f"hop{h}"] for h in MACRO_HOPS]
    if None not in ems:
        se_macro = math.sqrt(sum(p * (1 - p) / total[h]
                                 for p, h in zip(ems, MACRO_HOPS))) / len(ems)
        out["macro"] = sum(ems) / len(ems)
        out["macro_ci"] = [out["macro"] - 1.96 * se_macro, out["macro"] + 1.96 * se_macro]
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
    """Student's t_0.975 for ``dof`` degrees of freedom; beyond 30, the normal 1.96 (off by
    < 3%)."""
    return T_975[dof - 1] if dof <= len(T_975) else 1.96


def t_interval(values):
    """(mean, low, high): the 95% t-interval of the mean, mean ± t_0.975(n−1) · s / √n, with s
    the sample std (n − 1)."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, None, None
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    t = t_975(n - 1)
    return m, m - t * s / math.sqrt(n), m + t * s / math.sqrt(n)


def seeds_for(sd, half_width):
    """The fewest paired seeds n whose 95% t-interval, t_0.975(n-1) * sd / sqrt(n), is at most
    ``half_width`` at this sd: a protocol's power line solved the other way ("–" for sd 0)."""
    if not sd:
        return "–"
    n = 2
    while t_975(n - 1) * sd / math.sqrt(n) > half_width:
        n += 1
    return n


# ----------------------------------------------------------------------------- runs
def em_key(cfg, worlds, validation=False, dtype=torch.float32):
    """The key of ``heldout-em.json``: what was scored (worlds and EVAL_SEED, or the dev file),
    and in which dtype when not float32 (bf16 may round a greedy choice the other way)."""
    scored = f"{worlds} worlds from {cfg['EVAL_SEED']}" if cfg["DATA"] == "toy" \
        else f"{cfg['DATA']} {cfg['DATA_DEV']}"
    return (scored + (" down (validation)" if validation else "")
            + ("" if dtype == torch.float32 else f" in {str(dtype).removeprefix('torch.')}"))


def cached_em(checkpoint, policy, tokenizer, cfg, worlds, validation=False, dtype=torch.float32):
    """``heldout_by_hops``, kept in the checkpoint's ``heldout-em.json`` per (worlds, EVAL_SEED,
    held-out or validation, dtype): a checkpoint never changes, so a long protocol evaluates each
    model once (delete the file after changing the evaluation code)."""
    key = em_key(cfg, worlds, validation, dtype)
    path = os.path.join(checkpoint, "heldout-em.json")
    cache = json.load(open(path)) if os.path.exists(path) else {}
    if key not in cache:
        cache[key] = heldout_by_hops(policy, tokenizer, cfg, worlds, validation, dtype)
        with open(path + ".tmp", "w") as f:
            json.dump(cache, f, indent=1)
        os.replace(path + ".tmp", path)
    return cache[key]


def group_name(run_dir):
    return re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(run_dir)))


def where_to_evaluate(cfg, device=None, dtype=None):
    """(device, dtype) a run is evaluated on: the DEVICE and DTYPE it trained with (train.py
    wrote them resolved to its config), unless ``device`` or ``dtype`` name others, so the final
    EM is computed as the quick checks during training were."""
    device = torch.device(device or cfg.get("DEVICE", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"this run computed on {device}, and torch sees no CUDA device here: "
                         "pass --device cpu (and --dtype float32 for the CPU's fastest path)")
    dtype = dtype or cfg.get("DTYPE", "float32")
    if dtype not in ("float32", "bfloat16"):
        raise SystemExit(f"--dtype {dtype}: evaluate.py computes in float32 or bfloat16")
    return device, getattr(torch, dtype)


def run_summary(run_dir, worlds, warmup_em=None, validation=False, device=None, dtype=None):
    """One row per run, evaluated on ``where_to_evaluate``. ``warmup_em`` maps warm-up paths to
    their macro EM: the GRPO and EviSD runs of one seed share a warm-up, so pass one dict for all
    runs to evaluate it once."""
    warmup_em = {} if warmup_em is None else warmup_em
    policy, tokenizer, cfg, sft_path, checkpoint = runs.load_run(run_dir, with_path=True)
    device, dtype = where_to_evaluate(cfg, device, dtype)
    em = cached_em(checkpoint, policy.to(device), tokenizer, cfg, worlds, validation, dtype)
    if sft_path and os.path.isdir(sft_path) and sft_path not in warmup_em:
        warmed = model.load_model(sft_path, local_files_only=True)[0].eval().to(device)
        warmup_em[sft_path] = cached_em(sft_path, warmed, tokenizer, cfg, worlds,
                                        validation, dtype).get("macro")
    metrics = runs.read_metrics(run_dir)
    steps = [m for m in metrics if not m.get("eval")]
    last = steps[-max(1, len(steps) // 5):] if steps else []   # the last fifth of training

    def mean(key):
        vals = [m[k] for m in last for k in key if m.get(k) is not None]
        return sum(vals) / len(vals) if vals else None
    return {"run": run_dir, "group": group_name(run_dir), "seed": cfg["SEED"],
            "method": cfg["METHOD"], "rl_steps": cfg["RL_STEPS"],
            "warmup_macro": warmup_em.get(sft_path), **em,
            "modulated_frac": mean(["modulated_frac"]),
            "gap_pos": mean(["search_gap_pos", "answer_gap_pos"]),   # mean action-token gap, A > 0
            "gap_neg": mean(["search_gap_neg", "answer_gap_neg"]),   # and A < 0
            "wall_min": sum(m["step_s"] for m in steps) / 60 if steps else None}


# ----------------------------------------------------------------------------- tables
def _num(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def runs_table(rows):
    """One line per run: EM per hop with its 95% interval, the macro and the warm-up's."""
    lines = ["| run | seed | " + " | ".join(f"{h}-hop EM [95%]" for h in HOPS)
             + " | macro [95%] | warm-up macro |",
             "|---" * (len(HOPS) + 4) + "|"]
    for r in rows:
        cells = [f"{_num(r[f'hop{h}'])} [{_num(r[f'hop{h}_ci'][0])}, "
                 f"{_num(r[f'hop{h}_ci'][1])}] (n={r[f'hop{h}_n']})"
                 for h in HOPS]
        ci = r.get("macro_ci") or [None, None]
        cells.append(f"{_num(r.get('macro'))} [{_num(ci[0])}, {_num(ci[1])}]")
        lines.append(f"| {r['run']} | {r['seed']} | " + " | ".join(cells)
                     + f" | {_num(r['warmup_macro'])} |")
    return "\n".join(lines)


def results_table(rows):
    """Rows grouped by method name: mean ± std over seeds for each column."""
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    cols = (["warmup_macro"] + [f"hop{h}" for h in HOPS]
            + ["macro", "modulated_frac", "gap_pos", "gap_neg", "wall_min"])
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


PAIRED_KEYS = ("macro", "hop1", "hop2")


def paired_differences(rows, baseline=None, keys=PAIRED_KEYS):
    """Every group against the baseline group (the GRPO runs, unless named), seed by seed.

    Returns {group: {"seeds": [...], "diff": {seed: {key: difference}}, "intervals": {key: (mean,
    low, high)}, "macro": (mean, low, high)}} for every one of ``keys`` (EM; with --speed, the
    learning speed too), each interval the 95% t-interval of the mean paired difference over
    the seeds that have it.
    """
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


def _interval(m, lo, hi):
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" if lo is not None else f"{m:+.3f} (one seed)"


def paired_table(paired):
    """Per seed, each measure's difference from the baseline; then each mean with its interval."""
    lines = []
    for name, p in paired.items():
        keys = list(p["intervals"])      # the measures with an interval, in the order paired
        lines += [f"{name} − {p['baseline']}, paired by seed:", "",
                  "| seed | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for s in p["seeds"]:
            lines.append(f"| {s} | " + " | ".join(_num(p["diff"][s][k], "+.3f") for k in keys)
                         + " |")
        lines += (["", f"mean paired difference and 95% t-interval over {len(p['seeds'])} seeds "
                       f"(t with {len(p['seeds']) - 1} df):", ""]
                  + [f"- {k}: {_interval(*p['intervals'][k])}" for k in keys] + [""])
    return "\n".join(lines)


def summary_table(rows, paired):
    """Measures down, groups across: the baseline's mean, and each group's paired difference
    from it with its 95% interval (the README's v3 table)."""
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
        cells = [_interval(*p["intervals"][k]) if k in p["intervals"] else "–"
                 for p in paired.values()]
        lines.append(f"| {k} | {_num(sum(vals) / len(vals) if vals else None)} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+",
                    help="run directories (OUT_DIR of train.py) or checkpoint directories")
    ap.add_argument("--worlds", type=int, default=EVAL_WORLDS,
                    help="held-out worlds to evaluate on")
    ap.add_argument("--baseline", default=None,
                    help="run group to pair against (default: the GRPO runs)")
    ap.add_argument("--validation", action="store_true",
                    help="validation worlds instead of held-out ones (for choosing settings)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--device", default=None,
                    help="evaluate on this device (default: the run's DEVICE), e.g. cpu, cuda")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                    help="compute in this dtype (default: the run's DTYPE)")
    lab_flags = ap.add_argument_group("the lab (lab/README.md)")
    lab_flags.add_argument("--speed", action="store_true",
                     help="learning speed from metrics.jsonl, paired too (lab/curves.py)")
    lab_flags.add_argument("--plot", nargs="?", const="curves.png", default=None,
                     help="learning curves PNG (lab/curves.py)")
    lab_flags.add_argument("--credit", type=int, nargs="?", const=64, default=0, metavar="Q",
                     help="the teacher's report card on Q held-out questions, default 64 "
                          "(lab/credit.py)")
    lab_flags.add_argument("--variants", action="store_true",
                     help="with --credit: score every EviSD design choice on the same samples")
    lab_flags.add_argument("--rules", action="store_true",
                     help="with --credit: grade every credit rule (GRPO, EviSD, the peers') on "
                          "the same samples")
    lab_flags.add_argument("--show", type=int, default=0, metavar="K",
                     help="print K example groups with each action token's gap (lab/credit.py)")
    args = ap.parse_args(argv)
    for run in args.runs:
        if not os.path.isdir(run):
            raise SystemExit(f"{run}: no such run directory")
    if args.worlds < 1 or args.credit < 0:
        raise SystemExit(f"--worlds must be >= 1 and --credit >= 0, got {args.worlds} and "
                         f"{args.credit}")
    if (args.variants or args.rules) and not args.credit:
        raise SystemExit("--variants and --rules go with --credit")
    if args.variants and args.rules:
        raise SystemExit("--variants and --rules: one at a time")
    # The lab's switch for the report card and the gap view: they sample episodes of their own.
    if args.credit or args.show:
        return runs.lab("credit", "--credit and --show").main(args)
    # The lab's switch for learning speed: how fast each habit goes, read off metrics.jsonl.
    curves = runs.lab("curves", "--speed and --plot") if args.speed or args.plot else None
    warmup_em = {}
    rows = [run_summary(run, args.worlds, warmup_em, args.validation, args.device, args.dtype)
            for run in tqdm(args.runs, desc="evaluate", dynamic_ncols=True)]
    keys = PAIRED_KEYS
    if curves:
        for row in rows:
            row.update(curves.speed(runs.read_metrics(row["run"]), row["rl_steps"]))
        keys += curves.SPEED_KEYS
    paired = paired_differences(rows, args.baseline, keys)
    print(runs_table(rows), results_table(rows), paired_table(paired),
          summary_table(rows, paired), sep="\n\n")
    if any("f1" in r for r in rows):
        real = runs.lab("real_data", "a real-data run")
        print("\n" + real.dev_table([r for r in rows if "f1" in r]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "paired": paired}, f, indent=1)
    if args.plot:
        metrics = {r["run"]: runs.read_metrics(r["run"]) for r in rows}
        print("wrote", curves.plot_curves(rows, metrics, args.plot))


if __name__ == "__main__":
    main(sys.argv[1:])
