"""Held-out evaluation: greedy EM per number of hops over several held-out worlds, paired
comparisons (EM and learning speed, curves.py), the teacher's report card, curves and examples.

    python evaluate.py out/evisd-s0 out/grpo-s0 ...   # EM per hop with 95% intervals; paired table
    python evaluate.py out/evisd-s0 --credit          # the teacher's report card (credit.py)
    python evaluate.py out/sft-<hash> --credit        # ... of a warm-up checkpoint
    python evaluate.py out/* --plot curves.png        # learning curves from metrics.jsonl
    python evaluate.py out/evisd-s0 --show 3          # episodes with the teacher-student gap

Held-out worlds have seeds EVAL_SEED, EVAL_SEED + 1, ...; validation worlds (for choosing
settings) EVAL_SEED - 1, EVAL_SEED - 2, ...; train.py keeps every training world below both.
Each world gives ~121 `test` questions (1 and 2 hops, over entities no train
question starts from) and 120 `ood` ones (3 hops); the headline ``macro`` is the mean of the
1-hop and 2-hop EM, the splits RL can move. Runs whose names differ only in a trailing
``-s<seed>`` are aggregated as mean ± std; runs of different methods with the same SEED share a
warm-up and are compared paired, seed by seed, against the GRPO runs.
A real-data run (train.py's DATA) is scored on its dev split: EM (its macro) and answer F1, with intervals.
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

import credit
import curves
import model as M
import real_data as rd
import runs
import search_env as se
import toy_world as tw

SPLITS = ("test", "ood")
HOPS = (1, 2, 3)             # 1 and 2 hops in `test`, 3 in `ood`
MACRO_HOPS = (1, 2)          # the headline: ood (3 hops) stays near 0 for every run
EVAL_WORLDS = 9              # ~1,090 test and 1,080 ood questions; one world's ~121 give EM ± 0.09
CREDIT_QUESTIONS = 64        # held-out questions sampled GROUP_SIZE times for --credit
EVAL_BATCH = 256             # questions per greedy rollout (a toy world has ~241, a real dev split thousands)


# ----------------------------------------------------------------------------- held-out questions
def eval_world_seed(cfg, world_index, validation=False):
    """The seed of held-out world ``EVAL_SEED + world_index``, or, with ``validation``, of
    validation world ``EVAL_SEED - 1 - world_index``, where settings may be chosen without
    looking at the held-out worlds."""
    return cfg["EVAL_SEED"] - 1 - world_index if validation else cfg["EVAL_SEED"] + world_index


def heldout_questions(cfg, split, n, world_index=0, validation=False):
    """n questions of a split of held-out (or validation) world ``world_index``, a fixed sample."""
    if rd.is_real(cfg):   # real data: of its dev (or validation) split, whatever split and world
        world = rd.dataset(cfg, "validation" if validation else "dev")
        return world, random.Random(0).sample(world.questions, n) if n < len(world.questions) else world.questions
    seed = eval_world_seed(cfg, world_index, validation)
    world = tw.make_world(seed, scale=cfg["WORLD_SCALE"])
    qs = world.split(split)
    qs = random.Random(seed).sample(qs, min(n, len(qs)))
    return world, qs


@torch.no_grad()
def greedy_episodes(lm, tokenizer, cfg, world, questions, device=None, dtype=torch.float32):
    """Greedy exact match of each question [len(questions)] and its answers, EVAL_BATCH at a time."""
    env = lambda q: se.SearchEnv(world.retriever(q), q, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"])
    rewards, answers = [], []
    for c in range(0, len(questions), EVAL_BATCH):
        with M.autocast(device or torch.device("cpu"), dtype):
            r = M.rollout(lm, tokenizer, env, questions[c:c + EVAL_BATCH], group_size=1, max_turns=cfg["MAX_TURNS"],
                          max_new_tokens=cfg["MAX_NEW_TOKENS"], greedy=True)
        rewards, answers = rewards + [r.rewards], answers + r.answers
    return torch.cat(rewards), answers


def heldout_em(lm, tokenizer, cfg, n=100, device=None, dtype=torch.float32):
    """The quick check during training: greedy EM on ``n`` questions of each split of the first
    held-out world, per split and per number of hops, and the macro, the mean of 1- and 2-hop EM
    as in the held-out table (None when the sample lacks one of them). Real data: real_scores."""
    if rd.is_real(cfg):   # dev EM (the macro) and F1
        return {k: round(v, 4) for k, v in real_scores(lm, tokenizer, cfg, n, device, dtype).items() if k in ("n", "em", "f1", "macro")}
    out, by_hops = {}, {h: [] for h in HOPS}
    for split in SPLITS:
        world, qs = heldout_questions(cfg, split, n)
        rewards = greedy_episodes(lm, tokenizer, cfg, world, qs, device, dtype)[0].tolist()
        out[split] = round(sum(rewards) / len(rewards), 4)
        for q, r in zip(qs, rewards):
            by_hops[q.hops].append(r)
    for h in HOPS:
        out[f"hop{h}"] = round(sum(by_hops[h]) / len(by_hops[h]), 4) if by_hops[h] else None
    ems = [out[f"hop{h}"] for h in MACRO_HOPS]
    out["macro"] = None if None in ems else round(sum(ems) / len(ems), 4)
    return out


def heldout_by_hops(lm, tokenizer, cfg, worlds=EVAL_WORLDS, device=None, dtype=torch.float32, validation=False):
    """Greedy EM on every `test` and `ood` question of ``worlds`` held-out (or validation)
    worlds, per number of hops, each with its 95% Wilson interval, and the macro over
    ``MACRO_HOPS`` (with a normal-approximation interval). Real data: real_scores, all questions."""
    if rd.is_real(cfg):
        return real_scores(lm, tokenizer, cfg, None, device, dtype, validation)
    correct, total = {h: 0 for h in HOPS}, {h: 0 for h in HOPS}
    for k in range(worlds):
        world = tw.make_world(eval_world_seed(cfg, k, validation), scale=cfg["WORLD_SCALE"])
        qs = [q for split in SPLITS for q in world.split(split)]
        for q, r in zip(qs, greedy_episodes(lm, tokenizer, cfg, world, qs, device, dtype)[0].tolist()):
            correct[q.hops] += r
            total[q.hops] += 1
    out = {}
    for h in HOPS:
        em = correct[h] / total[h] if total[h] else None
        lo, hi = wilson(correct[h], total[h]) if total[h] else (None, None)
        out[f"hop{h}"], out[f"hop{h}_n"], out[f"hop{h}_ci"] = em, total[h], [lo, hi]
    ems = [out[f"hop{h}"] for h in MACRO_HOPS]
    if None not in ems:
        se_macro = math.sqrt(sum(p * (1 - p) / total[h] for p, h in zip(ems, MACRO_HOPS))) / len(ems)
        out["macro"] = sum(ems) / len(ems)
        out["macro_ci"] = [out["macro"] - 1.96 * se_macro, out["macro"] + 1.96 * se_macro]
    return out


def real_scores(lm, tokenizer, cfg, n=None, device=None, dtype=torch.float32, validation=False):
    """Real data: greedy EM and answer F1 on the dev (or validation) split, or a fixed sample of
    n of its questions, with 95% intervals (Wilson; normal for F1), and EM per number of hops.
    ``macro`` is the EM, so the tables and the paired comparison read it as a toy run's."""
    world, qs = heldout_questions(cfg, "dev", n or math.inf, validation=validation)
    em, answers = greedy_episodes(lm, tokenizer, cfg, world, qs, device, dtype)
    f1 = torch.tensor([se.f1_score(a, q.answers) for a, q in zip(answers, qs)], dtype=torch.float64)
    m, half = f1.mean().item(), (1.96 * f1.std().item() / math.sqrt(len(qs)) if len(qs) > 1 else 0.0)
    out = {"n": len(qs), "f1": m, "f1_ci": [m - half, m + half]}
    for key, keep in [("em", lambda q: True)] + [(f"hop{h}", lambda q, h=h: q.hops == h) for h in HOPS]:
        hit = [e for e, q in zip(em.tolist(), qs) if keep(q)]
        out[key], out[f"{key}_n"], out[f"{key}_ci"] = \
            (sum(hit) / len(hit), len(hit), list(wilson(sum(hit), len(hit)))) if hit else (None, 0, [None, None])
    return dict(out, macro=out["em"], macro_ci=out["em_ci"])


# ----------------------------------------------------------------------------- intervals
def wilson(successes, n, z=1.96):
    """The Wilson score interval of a binomial proportion (sensible at 0 and 1, unlike p ± z·se)."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


# Two-sided 95% quantiles of Student's t (t_0.975) for 1..30 degrees of freedom.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(values):
    """(mean, low, high): the 95% t-interval of the mean, mean ± t_0.975(n−1) · s / √n, with s
    the sample std (n − 1). Beyond 30 degrees of freedom, the normal 1.96 (off by < 3%)."""
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, None, None
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    t = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    return m, m - t * s / math.sqrt(n), m + t * s / math.sqrt(n)


# ----------------------------------------------------------------------------- runs
def cached_em(checkpoint, lm, tok, cfg, worlds, validation=False):
    """``heldout_by_hops``, kept in the checkpoint's ``heldout-em.json`` per (worlds, EVAL_SEED,
    held-out or validation): a checkpoint never changes, so a long protocol evaluates each model
    once (delete the file after changing the evaluation code)."""
    key = (f"{cfg['DATA']} {cfg['DATA_DEV']}" if rd.is_real(cfg) else f"{worlds} worlds from {cfg['EVAL_SEED']}") \
        + (" down (validation)" if validation else "")
    path = os.path.join(checkpoint, "heldout-em.json")
    cache = json.load(open(path)) if os.path.exists(path) else {}
    if key not in cache:
        cache[key] = heldout_by_hops(lm, tok, cfg, worlds, validation=validation)
        with open(path + ".tmp", "w") as f:
            json.dump(cache, f, indent=1)
        os.replace(path + ".tmp", path)
    return cache[key]


def group_name(run_dir):
    return re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(run_dir)))


def run_summary(run_dir, worlds, warmup_em=None, validation=False):
    """One row per run. ``warmup_em`` maps warm-up paths to their macro EM: the GRPO and EviSD
    runs of one seed share a warm-up, so pass one dict for all runs to evaluate it once."""
    warmup_em = {} if warmup_em is None else warmup_em
    lm, tok, cfg, sft_path, checkpoint = runs.load_run(run_dir, with_path=True)
    em = cached_em(checkpoint, lm, tok, cfg, worlds, validation)
    if sft_path and os.path.isdir(sft_path) and sft_path not in warmup_em:
        warmup = M.load_model(sft_path, local_files_only=True)[0].eval()
        warmup_em[sft_path] = cached_em(sft_path, warmup, tok, cfg, worlds, validation).get("macro")
    metrics = runs.read_metrics(run_dir)
    steps = [m for m in metrics if not m.get("eval")]
    last = steps[-max(1, len(steps) // 5):] if steps else []   # the last fifth of training

    def mean(key):
        vals = [m[k] for m in last for k in key if m.get(k) is not None]
        return sum(vals) / len(vals) if vals else None
    return {"run": run_dir, "group": group_name(run_dir), "seed": cfg["SEED"], "method": cfg["METHOD"],
            "warmup_macro": warmup_em.get(sft_path), **em,
            "modulated_frac": mean(["modulated_frac"]),
            "gap_pos": mean(["search_gap_pos", "answer_gap_pos"]),   # mean action-token gap, A > 0
            "gap_neg": mean(["search_gap_neg", "answer_gap_neg"]),   # and A < 0
            "wall_min": sum(m["step_s"] for m in steps) / 60 if steps else None,
            **curves.speed(metrics, cfg["RL_STEPS"])}   # how fast each habit goes (curves.py)


# ----------------------------------------------------------------------------- tables
def _num(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def runs_table(rows):
    """One line per run: EM per hop with its 95% interval, the macro and the warm-up's."""
    lines = ["| run | seed | " + " | ".join(f"{h}-hop EM [95%]" for h in HOPS) + " | macro [95%] | warm-up macro |",
             "|---" * (len(HOPS) + 4) + "|"]
    for r in rows:
        cells = [f"{_num(r[f'hop{h}'])} [{_num(r[f'hop{h}_ci'][0])}, {_num(r[f'hop{h}_ci'][1])}] (n={r[f'hop{h}_n']})"
                 for h in HOPS]
        ci = r.get("macro_ci") or [None, None]
        cells.append(f"{_num(r.get('macro'))} [{_num(ci[0])}, {_num(ci[1])}]")
        lines.append(f"| {r['run']} | {r['seed']} | " + " | ".join(cells) + f" | {_num(r['warmup_macro'])} |")
    return "\n".join(lines)


def results_table(rows):
    """Rows grouped by method name: mean ± std over seeds for each column."""
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    cols = ["warmup_macro"] + [f"hop{h}" for h in HOPS] + ["macro", "modulated_frac", "gap_pos", "gap_neg", "wall_min"]
    lines = ["| run | seeds | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for name, rs in groups.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in rs if r.get(c) is not None]
            if not vals:
                cells.append("–")
                continue
            t = torch.tensor(vals, dtype=torch.float64)
            cells.append(f"{t.mean().item():.3f} ± {t.std().item():.3f}" if len(vals) > 1 else f"{vals[0]:.3f}")
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PAIRED_KEYS = ("macro", "hop1", "hop2") + curves.SPEED_KEYS


def paired_differences(rows, baseline=None):
    """Every group against the baseline group (the GRPO runs, unless named), seed by seed.

    Returns {group: {"seeds": [...], "diff": {seed: {key: difference}}, "intervals": {key: (mean,
    low, high)}, "macro": (mean, low, high)}} for every key of PAIRED_KEYS (EM and learning speed),
    each interval the 95% t-interval of the mean paired difference over the seeds that have it.
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
        diff = {s: {k: None if None in (by_seed[s].get(k), groups[baseline][s].get(k))   # real data lacks
                    else by_seed[s][k] - groups[baseline][s][k] for k in PAIRED_KEYS} for s in seeds}   # a hop, habits
        intervals = {k: t_interval(vals) for k in PAIRED_KEYS
                     if (vals := [diff[s][k] for s in seeds if diff[s][k] is not None])}
        out[name] = {"baseline": baseline, "seeds": seeds, "diff": diff, "intervals": intervals,
                     "macro": intervals.get("macro", (None, None, None))}
    return out


def _interval(m, lo, hi):
    return f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" if lo is not None else f"{m:+.3f} (one seed)"


def paired_table(paired):
    """Per seed, each measure's difference from the baseline; then each mean with its interval."""
    lines = []
    for name, p in paired.items():
        keys = [k for k in PAIRED_KEYS if k in p["intervals"]]
        lines += [f"{name} − {p['baseline']}, paired by seed:", "",
                  "| seed | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for s in p["seeds"]:
            lines.append(f"| {s} | " + " | ".join(_num(p["diff"][s][k], "+.3f") for k in keys) + " |")
        lines += (["", f"mean paired difference and 95% t-interval over {len(p['seeds'])} seeds (t with "
                       f"{len(p['seeds']) - 1} df):", ""] + [f"- {k}: {_interval(*p['intervals'][k])}" for k in keys] + [""])
    return "\n".join(lines)


def summary_table(rows, paired):
    """Measures down, groups across: the baseline's mean, and each group's paired difference
    from it with its 95% interval (the README's v3 table)."""
    if not paired:
        return ""
    baseline = next(iter(paired.values()))["baseline"]
    base = [r for r in rows if r["group"] == baseline]
    lines = [f"| measure | {baseline} (mean of {len(base)}) | " +
             " | ".join(f"{g} − {baseline} [95%] (n={len(p['seeds'])})" for g, p in paired.items()) + " |",
             "|---" * (len(paired) + 2) + "|"]
    for k in [k for k in PAIRED_KEYS if any(k in p["intervals"] for p in paired.values())]:
        vals = [r[k] for r in base if r.get(k) is not None]
        cells = [_interval(*p["intervals"][k]) if k in p["intervals"] else "–" for p in paired.values()]
        lines.append(f"| {k} | {_num(sum(vals) / len(vals) if vals else None)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dev_table(rows):
    """Real-data runs: dev EM and answer F1, each with its 95% interval (the EM is their macro)."""
    cell = lambda r, k: f"{_num(r[k])} [{_num(r[k + '_ci'][0])}, {_num(r[k + '_ci'][1])}]"
    return "\n".join(["| run | seed | questions | EM [95%] | F1 [95%] |", "|---|---|---|---|---|"] +
                     [f"| {r['run']} | {r['seed']} | {r['n']} | {cell(r, 'em')} | {cell(r, 'f1')} |" for r in rows])


def credit_sets(cfg, n_questions, validation=False):
    """Held-out (or validation) `test` questions for the report card: a fixed sample, world by world."""
    if rd.is_real(cfg):
        return [heldout_questions(cfg, "test", n_questions, validation=validation)]
    sets, k = [], 0
    while n_questions > 0:
        world, qs = heldout_questions(cfg, "test", n_questions, world_index=k, validation=validation)
        sets.append((world, qs))
        n_questions -= len(qs)
        k += 1
    return sets


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (OUT_DIR of train.py) or checkpoint directories")
    ap.add_argument("--worlds", type=int, default=EVAL_WORLDS, help="held-out worlds to evaluate on")
    ap.add_argument("--baseline", default=None, help="run group to pair against (default: the GRPO runs)")
    ap.add_argument("--credit", type=int, nargs="?", const=CREDIT_QUESTIONS, default=0, metavar="Q",
                    help=f"the teacher's report card on Q held-out questions (default {CREDIT_QUESTIONS})")
    ap.add_argument("--variants", action="store_true",
                    help="with --credit: score every EviSD design choice of credit.VARIANTS on the same samples")
    ap.add_argument("--validation", action="store_true",
                    help="validation worlds instead of held-out ones (for choosing settings)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--plot", nargs="?", const="curves.png", default=None, help="learning curves PNG")
    ap.add_argument("--show", type=int, default=0, metavar="K", help="print K example groups")
    args = ap.parse_args(argv)
    for run in args.runs:
        if not os.path.isdir(run):
            raise SystemExit(f"{run}: no such run directory")
    if args.variants and not args.credit:
        raise SystemExit("--variants goes with --credit")
    if args.worlds < 1 or args.credit < 0:
        raise SystemExit(f"--worlds must be >= 1 and --credit >= 0, got {args.worlds} and {args.credit}")
    if args.show:
        lm, tok, cfg, _ = runs.load_run(args.runs[0])
        world, qs = heldout_questions(cfg, "test", 4 * args.show)   # the groups with A != 0 are shown first
        credit.show_episodes(lm, tok, cfg, world, qs, os.path.join(args.runs[0], "episodes.html"), args.show)
        return
    if args.credit:
        cards = {}
        for run in args.runs:
            lm, tok, cfg, _ = runs.load_run(run)
            sets = credit_sets(cfg, args.credit, args.validation)
            with tqdm(total=args.credit, desc=f"credit {run}", dynamic_ncols=True) as bar:
                cards[run] = credit.report(lm, tok, cfg, sets, progress=bar.update,
                                           variants=credit.VARIANTS if args.variants else None)
            if args.variants:
                print(f"\n## {run}\n\n{credit.variants_table(cards[run])}")
            else:
                print(f"\n## {run}\n\n{credit.format_report(cards[run])}")
        out = args.json or os.path.join(args.runs[0], "credit.json")
        with open(out, "w") as f:
            json.dump(cards, f, indent=1)
        print("wrote", out)
        return
    warmup_em = {}
    rows = [run_summary(run, args.worlds, warmup_em, args.validation)
            for run in tqdm(args.runs, desc="evaluate", dynamic_ncols=True)]
    paired = paired_differences(rows, args.baseline)
    print(runs_table(rows), results_table(rows), paired_table(paired), summary_table(rows, paired), sep="\n\n")
    if any("f1" in r for r in rows):
        print("\n" + dev_table([r for r in rows if "f1" in r]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "paired": paired}, f, indent=1)
    if args.plot:
        print("wrote", curves.plot_curves(rows, {r["run"]: runs.read_metrics(r["run"]) for r in rows}, args.plot))


if __name__ == "__main__":
    main(sys.argv[1:])
