"""Held-out evaluation: greedy EM per number of hops over several held-out worlds, paired
comparisons between methods, the teacher's credit report card, learning curves and examples.

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
"""
import argparse
import html
import json
import math
import os
import random
import re
import sys

import torch
from tqdm import tqdm

import credit
import model as M
import search_env as se
import toy_world as tw

SPLITS = ("test", "ood")
HOPS = (1, 2, 3)             # 1 and 2 hops in `test`, 3 in `ood`
MACRO_HOPS = (1, 2)          # the headline: ood (3 hops) stays near 0 for every run
EVAL_WORLDS = 9              # ~1,090 test and 1,080 ood questions; one world's ~121 give EM ± 0.09
CREDIT_QUESTIONS = 64        # held-out questions sampled GROUP_SIZE times for --credit
VALIDATION_WORLDS = 1000     # seeds EVAL_SEED - 1000 .. EVAL_SEED - 1: validation, never trained on


# ----------------------------------------------------------------------------- held-out questions
def heldout_questions(cfg, split, n, world_index=0, validation=False):
    """n questions of a split of held-out world ``EVAL_SEED + world_index``, a fixed sample; or,
    with ``validation``, of validation world ``EVAL_SEED - 1 - world_index``, where settings may
    be chosen without looking at the held-out worlds."""
    seed = cfg["EVAL_SEED"] - 1 - world_index if validation else cfg["EVAL_SEED"] + world_index
    world = tw.make_world(seed, scale=cfg["WORLD_SCALE"])
    qs = world.split(split)
    qs = random.Random(seed).sample(qs, min(n, len(qs)))
    return world, qs


@torch.no_grad()
def greedy_rewards(lm, tokenizer, cfg, world, questions, device=None, dtype=torch.float32):
    """Greedy exact match of each question, [len(questions)]."""
    env = lambda q: se.SearchEnv(world, q, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"])
    with M.autocast(device or torch.device("cpu"), dtype):
        r = M.rollout(lm, tokenizer, env, questions, group_size=1, max_turns=cfg["MAX_TURNS"],
                      max_new_tokens=cfg["MAX_NEW_TOKENS"], greedy=True)
    return r.rewards


def heldout_em(lm, tokenizer, cfg, n=100, splits=SPLITS, device=None, dtype=torch.float32):
    """Greedy EM per split of the first held-out world, and their mean: the learning curve's
    quick check during training (``EVAL_QUESTIONS`` per split)."""
    out = {}
    for split in splits:
        world, qs = heldout_questions(cfg, split, n)
        out[split] = round(greedy_rewards(lm, tokenizer, cfg, world, qs, device, dtype).mean().item(), 4)
    out["macro"] = round(sum(out[s] for s in splits) / len(splits), 4)
    return out


def heldout_by_hops(lm, tokenizer, cfg, worlds=EVAL_WORLDS, device=None, dtype=torch.float32):
    """Greedy EM on every `test` and `ood` question of ``worlds`` held-out worlds, per number
    of hops, each with its 95% Wilson interval, and the macro over ``MACRO_HOPS`` (with a
    normal-approximation interval)."""
    correct, total = {h: 0 for h in HOPS}, {h: 0 for h in HOPS}
    for k in range(worlds):
        world = tw.make_world(cfg["EVAL_SEED"] + k, scale=cfg["WORLD_SCALE"])
        qs = [q for split in SPLITS for q in world.split(split)]
        for q, r in zip(qs, greedy_rewards(lm, tokenizer, cfg, world, qs, device, dtype).tolist()):
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
def checkpoints(out_dir):
    """A run's ``ckpt-NNNNNN`` directories, oldest first. The ``.tmp`` and ``.old`` leftovers of
    an interrupted save are not checkpoints."""
    names = [n for n in os.listdir(out_dir) if re.fullmatch(r"ckpt-\d+", n)] if os.path.isdir(out_dir) else []
    return [os.path.join(out_dir, n) for n in sorted(names, key=lambda n: int(n[5:]))]


def load_checkpoint(out_dir):
    """(path, model, tokenizer, training state) of the newest readable checkpoint, or None.

    One whose weights, tokenizer or state.pt are missing or damaged is reported by name, and
    the one before it is tried (train.py keeps two)."""
    for path in reversed(checkpoints(out_dir)):
        try:
            lm, tok = M.load_model(path, local_files_only=True)
            state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
            missing = [k for k in ("step", "bad_steps", "optimizer", "rng", "config") if k not in state]
            if missing:
                raise KeyError(f"state.pt has no {', '.join(missing)}")
            return path, lm, tok, state
        # A damaged file fails in many ways (OSError, a zip, pickle or safetensors error, ...):
        # any of them means this checkpoint cannot be used.
        except Exception as e:
            why = (str(e).strip().splitlines() or [""])[0]
            print(f"warning: checkpoint {path} is unreadable ({type(e).__name__}: {why}); "
                  "trying an older one", file=sys.stderr)
    return None


def load_run(run_dir, with_path=False):
    """(model, tokenizer, config, warm-up checkpoint path) of a run's newest readable checkpoint,
    or of a checkpoint directory itself (a ``ckpt-*`` or a warm-up ``sft-*``); ``with_path``
    appends the path of the checkpoint read."""
    path = run_dir
    if os.path.exists(os.path.join(run_dir, "state.pt")):
        lm, tok = M.load_model(run_dir, local_files_only=True)
        state = torch.load(os.path.join(run_dir, "state.pt"), weights_only=False)
    else:
        found = load_checkpoint(run_dir)
        if found is None:
            raise SystemExit(f"{run_dir}: no readable checkpoint (ckpt-*) found; has it trained?")
        path, lm, tok, state = found
    out = lm.eval(), tok, state["config"], state.get("sft_path")
    return out + (path,) if with_path else out


def cached_em(checkpoint, lm, tok, cfg, worlds):
    """``heldout_by_hops``, kept in the checkpoint's ``heldout-em.json`` per (worlds, EVAL_SEED):
    a checkpoint never changes, so a long protocol evaluates each model once (delete the file
    after changing the evaluation code)."""
    path, key = os.path.join(checkpoint, "heldout-em.json"), f"{worlds} worlds from {cfg['EVAL_SEED']}"
    cache = json.load(open(path)) if os.path.exists(path) else {}
    if key not in cache:
        cache[key] = heldout_by_hops(lm, tok, cfg, worlds)
        with open(path + ".tmp", "w") as f:
            json.dump(cache, f, indent=1)
        os.replace(path + ".tmp", path)
    return cache[key]


def read_metrics(run_dir):
    """The rows of a run's metrics.jsonl. A line that is not a JSON row with a step (the torn
    last line of a run killed mid-write) is dropped with a one-line warning; the rest are kept."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    rows, bad = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
            elif line.strip():
                bad.append(n)
    if bad:
        print(f"warning: {path}: dropped {len(bad)} unreadable line(s), the first is line {bad[0]} "
              "(a write cut short leaves one)", file=sys.stderr)
    return rows


def group_name(run_dir):
    return re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(run_dir)))


def run_summary(run_dir, worlds, warmup_em=None):
    """One row per run. ``warmup_em`` maps warm-up paths to their macro EM: the GRPO and EviSD
    runs of one seed share a warm-up, so pass one dict for all runs to evaluate it once."""
    warmup_em = {} if warmup_em is None else warmup_em
    lm, tok, cfg, sft_path, checkpoint = load_run(run_dir, with_path=True)
    em = cached_em(checkpoint, lm, tok, cfg, worlds)
    if sft_path and os.path.isdir(sft_path) and sft_path not in warmup_em:
        warmup = M.load_model(sft_path, local_files_only=True)[0].eval()
        warmup_em[sft_path] = cached_em(sft_path, warmup, tok, cfg, worlds).get("macro")
    steps = [m for m in read_metrics(run_dir) if not m.get("eval")]
    last = steps[-max(1, len(steps) // 5):] if steps else []   # the last fifth of training

    def mean(key):
        vals = [m[k] for m in last for k in key if m.get(k) is not None]
        return sum(vals) / len(vals) if vals else None
    return {"run": run_dir, "group": group_name(run_dir), "seed": cfg["SEED"], "method": cfg["METHOD"],
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
    lines = ["| run | seed | " + " | ".join(f"{h}-hop EM [95%]" for h in HOPS) + " | macro [95%] | warm-up macro |",
             "|---" * (len(HOPS) + 5) + "|"]
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


def paired_differences(rows, baseline=None):
    """Every group against the baseline group (the GRPO runs, unless named), seed by seed.

    Returns {group: {"seeds": [...], "diff": {seed: {macro, hop1, hop2}}, "macro": (mean, lo, hi)}}
    where the interval is the 95% t-interval of the mean paired macro difference over seeds.
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
        diff = {s: {k: by_seed[s][k] - groups[baseline][s][k] for k in ("macro", "hop1", "hop2")} for s in seeds}
        out[name] = {"baseline": baseline, "seeds": seeds, "diff": diff,
                     "macro": t_interval([diff[s]["macro"] for s in seeds])}
    return out


def paired_table(paired):
    lines = []
    for name, p in paired.items():
        lines += [f"{name} − {p['baseline']}, paired by seed:", "",
                  "| seed | macro diff | 1-hop diff | 2-hop diff |", "|---|---|---|---|"]
        for s in p["seeds"]:
            d = p["diff"][s]
            lines.append(f"| {s} | {d['macro']:+.3f} | {d['hop1']:+.3f} | {d['hop2']:+.3f} |")
        m, lo, hi = p["macro"]
        interval = f"[{lo:+.3f}, {hi:+.3f}]" if lo is not None else "(one seed: no interval)"
        lines += ["", f"mean paired macro difference {m:+.3f}, 95% t-interval {interval} over "
                      f"{len(p['seeds'])} seeds (t with {len(p['seeds']) - 1} df)", ""]
    return "\n".join(lines)


def credit_sets(cfg, n_questions, validation=False):
    """Held-out (or validation) `test` questions for the report card: a fixed sample, world by world."""
    sets, k = [], 0
    while n_questions > 0:
        world, qs = heldout_questions(cfg, "test", n_questions, world_index=k, validation=validation)
        sets.append((world, qs))
        n_questions -= len(qs)
        k += 1
    return sets


# ----------------------------------------------------------------------------- plots and examples
def plot_curves(run_dirs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("reward", "sampled train reward"), ("eval_macro", "held-out EM (quick check)"),
              ("label_answer_premature", "premature answers (share of answers)"),
              ("label_search_partial", "partial-name queries (share of searches)"),
              ("kl", "KL to warm-up"), ("modulated_frac", "modulated token fraction")]
    fig, axes = plt.subplots(2, 3, figsize=(16, 7.5))
    axes = axes.ravel()
    for run_index, run in enumerate(run_dirs):      # one colour per run in every panel
        rows = read_metrics(run)
        for ax, (key, title) in zip(axes, panels):
            pts = [(m["step"], m[key]) for m in rows if m.get(key) is not None]
            if key.startswith(("reward", "label_")) and len(pts) > 10:   # smooth the noisy per-step shares
                k = 10
                pts = [(pts[i][0], sum(p[1] for p in pts[i - k + 1:i + 1]) / k) for i in range(k - 1, len(pts))]
            if pts:
                ax.plot(*zip(*pts), color=f"C{run_index % 10}", label=os.path.basename(os.path.normpath(run)),
                        marker="o" if key.startswith("eval") else None, ms=3)
            ax.set_title(title)
            ax.set_xlabel("RL step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def printable(text):
    """``text`` as stdout can encode it: a lone surrogate or a character the terminal lacks
    becomes a backslash escape, so no model output can crash a print."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def show_episodes(run_dir, k, html_path):
    """Sample K groups, score them with the teacher, print each action token's gap."""
    import evisd
    import grpo
    lm, tok, cfg, _ = load_run(run_dir)
    world, qs = heldout_questions(cfg, "test", k)
    torch.manual_seed(0)
    env = lambda q: se.SearchEnv(world, q, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"])
    r = M.rollout(lm, tok, env, qs, group_size=4, max_turns=cfg["MAX_TURNS"],
                  max_new_tokens=cfg["MAX_NEW_TOKENS"], temperature=cfg["TEMPERATURE"])
    adv = grpo.group_advantages(r.rewards, 4)
    # The gap as training computes it (the run's placement and temperature), but for every
    # episode, even those with A = 0 that training never re-scores.
    with torch.no_grad():
        lp_s = M.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask, temperature=cfg["TEMPERATURE"])
    token_adv, _, lp_t = evisd.step_advantages(lm, tok, cfg, world, r, adv, lp_s, rows=range(len(r.questions)))
    tty = sys.stdout.isatty()
    pages = []
    for i in range(0, len(qs) * 4, 4):
        for j in (i, i + 1):   # two samples of each question
            n = int(r.attention_mask[j].sum())
            p = int(r.prompt_len[j])
            head = f"Q: {r.questions[j].question}  gold={r.questions[j].answers[0]}  reward={r.rewards[j]:.0f}  A={adv[j]:+.2f}"
            print("\n" + printable(head))
            text, page = [], [f"<p><b>{html.escape(head)}</b><br>"]
            for t in range(p, n):
                piece = tok.decode([int(r.input_ids[j, t])])
                if r.info_mask[j, t]:
                    text.append("\x1b[2m" + piece + "\x1b[0m" if tty else piece)
                    page.append(f"<span style='color:#999'>{html.escape(piece)}</span>")
                elif r.action_kind[j, t]:
                    g = (lp_t[j, t] - lp_s[j, t]).item()
                    colour = "32" if g > 0 else "31"
                    text.append(f"\x1b[{colour}m{piece}\x1b[0m[{g:+.1f}]" if tty else f"{piece}[{g:+.1f}]")
                    alpha = min(abs(g) / 2, 1)
                    rgb = "0,160,0" if g > 0 else "200,0,0"
                    page.append(f"<span title='gap {g:+.2f}, Â/A {token_adv[j, t] / adv[j] if adv[j] else 1:.2f}' "
                                f"style='background:rgba({rgb},{alpha:.2f})'>{html.escape(piece)}</span>")
                else:
                    text.append(piece)
                    page.append(html.escape(piece))
            print(printable("".join(text)))
            pages.append("".join(page) + "</p>")
    with open(html_path, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write("<html><meta charset='utf-8'><body style='font-family:monospace;white-space:pre-wrap'>"
                "<h3>Teacher-student gap per action token (green: teacher more likely; hover for values)</h3>"
                + "\n".join(pages) + "</body></html>")
    print(f"\nwrote {html_path}")


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
                    help="with --credit: validation worlds instead of held-out ones (for choosing settings)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--plot", nargs="?", const="curves.png", default=None, help="learning curves PNG")
    ap.add_argument("--show", type=int, default=0, metavar="K", help="print K example groups")
    args = ap.parse_args(argv)
    for run in args.runs:
        if not os.path.isdir(run):
            raise SystemExit(f"{run}: no such run directory")
    if (args.variants or args.validation) and not args.credit:
        raise SystemExit("--variants and --validation go with --credit")
    if args.worlds < 1 or args.credit < 0:
        raise SystemExit(f"--worlds must be >= 1 and --credit >= 0, got {args.worlds} and {args.credit}")
    if args.show:
        show_episodes(args.runs[0], args.show, os.path.join(args.runs[0], "episodes.html"))
        return
    if args.credit:
        cards = {}
        for run in args.runs:
            lm, tok, cfg, _ = load_run(run)
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
    rows = [run_summary(run, args.worlds, warmup_em) for run in tqdm(args.runs, desc="evaluate", dynamic_ncols=True)]
    paired = paired_differences(rows, args.baseline)
    print(runs_table(rows), results_table(rows), paired_table(paired), sep="\n\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "paired": paired}, f, indent=1)
    if args.plot:
        print("wrote", plot_curves(args.runs, args.plot))


if __name__ == "__main__":
    main(sys.argv[1:])
