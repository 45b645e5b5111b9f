"""Held-out evaluation: greedy exact match on the test and ood splits, tables, plots, examples.

    python evaluate.py out/evisd-s0 out/grpo-s0 ...      # EM per split, one row per run
    python evaluate.py out/* --plot curves.png            # learning curves from metrics.jsonl
    python evaluate.py out/evisd-s0 --show 3              # episodes with the teacher-student gap

Runs whose names differ only in a trailing ``-s<seed>`` are aggregated as mean ± std.
The held-out world (seed ``EVAL_SEED``) is disjoint from every training world.
"""
import argparse
import html
import json
import os
import random
import re
import sys

import torch

import model as M
import search_env as se

SPLITS = ("test", "ood")


def heldout_questions(cfg, split, n):
    """n questions of a split of the held-out world: a fixed sample, seeded by EVAL_SEED."""
    world = se.make_world(cfg["EVAL_SEED"], scale=cfg["WORLD_SCALE"])
    qs = world.split(split)
    qs = random.Random(cfg["EVAL_SEED"]).sample(qs, min(n, len(qs)))
    return world, qs


@torch.no_grad()
def heldout_em(lm, tokenizer, cfg, n=100, splits=SPLITS, device=None, dtype=torch.float32):
    """Greedy EM per split and their macro-average."""
    out = {}
    for split in splits:
        world, qs = heldout_questions(cfg, split, n)
        env = lambda q: se.SearchEnv(world, q, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"])
        with M.autocast(device or torch.device("cpu"), dtype):
            r = M.rollout(lm, tokenizer, env, qs, group_size=1, max_turns=cfg["MAX_TURNS"],
                          max_new_tokens=cfg["MAX_NEW_TOKENS"], greedy=True)
        out[split] = round(r.rewards.mean().item(), 4)
    out["macro"] = round(sum(out[s] for s in splits) / len(splits), 4)
    return out


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


def load_run(run_dir):
    """(model, tokenizer, config, warm-up checkpoint path) of a run's newest readable checkpoint."""
    found = load_checkpoint(run_dir)
    if found is None:
        raise SystemExit(f"{run_dir}: no readable checkpoint (ckpt-*) found; has it trained?")
    _, lm, tok, state = found
    return lm.eval(), tok, state["config"], state.get("sft_path")


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


def results_table(rows, splits):
    """Rows grouped by method name: mean ± std over seeds for each column."""
    groups = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    cols = ["warmup_macro"] + list(splits) + ["macro", "modulated_frac", "gap_pos", "gap_neg", "wall_min"]
    lines = ["| run | seeds | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
    for name, rs in groups.items():
        cells = []
        for c in cols:
            vals = [r[c] for r in rs if r.get(c) is not None]
            if not vals:
                cells.append("–")
                continue
            t = torch.tensor(vals, dtype=torch.float64)
            std = t.std().item() if len(vals) > 1 else 0.0
            cells.append(f"{t.mean().item():.3f} ± {std:.3f}" if len(vals) > 1 else f"{vals[0]:.3f}")
        lines.append(f"| {name} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_summary(run_dir, splits, n, warmup_em=None):
    """One table row. ``warmup_em`` maps warm-up paths to their macro EM: the GRPO and EviSD
    runs of one seed share a warm-up, so pass one dict for all runs to evaluate it once."""
    warmup_em = {} if warmup_em is None else warmup_em
    lm, tok, cfg, sft_path = load_run(run_dir)
    em = heldout_em(lm, tok, cfg, n=n, splits=splits)
    if sft_path and os.path.isdir(sft_path) and sft_path not in warmup_em:
        warmup_em[sft_path] = heldout_em(M.load_model(sft_path, local_files_only=True)[0].eval(), tok, cfg,
                                         n=n, splits=splits)["macro"]
    steps = [m for m in read_metrics(run_dir) if not m.get("eval")]
    last = steps[-max(1, len(steps) // 5):] if steps else []   # the last fifth of training

    def mean(key):
        vals = [m[k] for m in last for k in key if m.get(k) is not None]
        return sum(vals) / len(vals) if vals else None
    return {"run": run_dir, "group": group_name(run_dir), "warmup_macro": warmup_em.get(sft_path), **em,
            "modulated_frac": mean(["modulated_frac"]),
            "gap_pos": mean(["search_gap_pos", "answer_gap_pos"]),   # mean action-token gap, A > 0
            "gap_neg": mean(["search_gap_neg", "answer_gap_neg"]),   # and A < 0
            "wall_min": sum(m["step_s"] for m in steps) / 60 if steps else None}


# ----------------------------------------------------------------------------- plots and examples
def plot_curves(run_dirs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("reward", "sampled train reward"), ("eval_macro", "held-out EM (macro)"),
              ("kl", "KL to warm-up"), ("modulated_frac", "modulated token fraction")]
    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    for run in run_dirs:
        rows = read_metrics(run)
        for ax, (key, title) in zip(axes, panels):
            pts = [(m["step"], m[key]) for m in rows if key in m]
            if key == "reward" and len(pts) > 10:   # smooth the noisy per-step reward
                k = 10
                pts = [(pts[i][0], sum(p[1] for p in pts[i - k + 1:i + 1]) / k) for i in range(k - 1, len(pts))]
            if pts:
                ax.plot(*zip(*pts), label=os.path.basename(os.path.normpath(run)),
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
    with torch.no_grad():
        lp_s = M.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask)
    lp_t = evisd.teacher_scores(lm, r, world, tok, lp_s, rows=range(len(r.questions)))  # all, even A = 0
    token_adv, _ = evisd.evisd_advantages(adv, lp_s, lp_t, r.gen_mask, r.action_kind, cfg["EVISD_EPS"])
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
    ap.add_argument("runs", nargs="+", help="run directories (OUT_DIR of train.py)")
    ap.add_argument("--splits", default=",".join(SPLITS), help="comma-separated, e.g. test,ood,train")
    ap.add_argument("--n", type=int, default=200, help="questions per split")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--plot", nargs="?", const="curves.png", default=None, help="learning curves PNG")
    ap.add_argument("--show", type=int, default=0, metavar="K", help="print K example groups")
    args = ap.parse_args(argv)
    for run in args.runs:
        if not os.path.isdir(run):
            raise SystemExit(f"{run}: no such run directory")
    if args.show:
        show_episodes(args.runs[0], args.show, os.path.join(args.runs[0], "episodes.html"))
        return
    splits = tuple(s for s in args.splits.split(",") if s)
    warmup_em = {}
    rows = [run_summary(run, splits, args.n, warmup_em) for run in args.runs]
    print(results_table(rows, splits))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        print("wrote", plot_curves(args.runs, args.plot))


if __name__ == "__main__":
    main(sys.argv[1:])
