"""One picture of credit: one episode's tokens coloured by the advantage each generated token
carries, under GRPO, EviSD (the paper's: the content of actions) and the whole-response row,
side by side (benchmark v5, issue 47).

    python lab/results/credit_picture.py WARMUP_DIR [--out lab/results/credit-v5.png]

The warm-up of seed 0 (out/v5/sft-f9d65139d7) samples one training-like group (8 episodes of
one 2-hop question of validation world 0, at TEMPERATURE, seed 0) and the shown episode is the
first with A != 0 that both searches and answers, a failed one if there is one (where credit is
hardest: which of its actions were fine?). Each panel colours the generated tokens (boxed) on
one scale centred on the episode's A: white is plain A, the two ends are A ± 0.2|A|, the bound
EviSD keeps to; grey text is what the model read (prompt, retrieved information), which carries
no advantage. The printed table gives each action's mean Â/A.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import evaluate  # noqa: E402
import evisd  # noqa: E402
import grpo  # noqa: E402
import model  # noqa: E402
import rollout  # noqa: E402
import search_env  # noqa: E402
import toy_world  # noqa: E402
import train  # noqa: E402
from lab import curves  # noqa: E402

PANELS = [("GRPO: Â = A on every generated token", None),
          ("EviSD (the paper's): the content of each action moves", {}),
          ("whole-response row: every generated token moves", {"EVISD_SPAN": "response"})]


def pick_episode(lm, tok, cfg, seed=0):
    """(world, Rollouts of one group, A [N], the student's log-probs, the episode shown)."""
    world = toy_world.make_world(evaluate.eval_world_seed(cfg, 0, validation=True))
    questions = [q for q in world.split("train") if q.hops == 2]
    for q in questions:
        torch.manual_seed(seed)
        envs = search_env.episodes(world, [q], cfg["GROUP_SIZE"], cfg["MAX_TURNS"], cfg["TOP_K"])
        r = rollout.rollout(lm, tok, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
        adv = grpo.group_advantages(r.rewards, cfg["GROUP_SIZE"])
        both = [i for i in range(len(adv)) if adv[i] != 0
                and {"search", "answer"} <= {s.kind for s in r.spans[i]}]
        if both:
            failed = [i for i in both if adv[i] < 0]
            with torch.no_grad():
                lp_s = model.token_logprobs(lm, r.input_ids, r.attention_mask, r.gen_mask,
                                            temperature=cfg["TEMPERATURE"])
            return world, r, adv, lp_s, (failed or both)[0]
    raise SystemExit("no group with a scored episode that searches and answers")


def draw(rows, tokens, read, A, lam, out):
    """rows: [(title, Â [n])] over ``tokens`` (strings); ``read`` [n] bool: not generated; the
    colour scale spans A ± lam |A|."""
    plt = curves.pyplot()
    scale = lam * abs(A)
    cmap = plt.get_cmap("PuOr_r")
    width, per_line = 14.0, 110                 # inches; characters per line
    lines, line, used = [], [], 0
    for j, t in enumerate(tokens):
        t = t.replace("\n", " ")
        if used + len(t) > per_line and line:
            lines.append(line)
            line, used = [], 0
        line.append(j)
        used += len(t)
    lines.append(line)
    height_panel = 0.24 * len(lines) + 0.5
    fig, axes = plt.subplots(len(rows), 1, figsize=(width, height_panel * len(rows)))
    for ax, (title, adv) in zip(axes, rows):
        ax.set_axis_off()
        ax.set_title(title, loc="left", fontsize=11)
        ax.set_xlim(0, per_line)
        ax.set_ylim(len(lines), 0)
        for y, line in enumerate(lines):
            x = 0.0
            for j in line:
                t = tokens[j].replace("\n", " ")
                colour = (0.5, 0.5, 0.5) if read[j] else "black"
                face = "white" if read[j] else cmap(0.5 + 0.5 * (adv[j] - A) / scale)
                ax.text(x, y + 0.5, t, fontsize=8, family="monospace", color=colour,
                        va="center", bbox=dict(boxstyle="square,pad=0.05", fc=face,
                                               ec="none" if read[j] else "0.6", lw=0.4))
                x += len(t)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(A - scale, A + scale))
    fig.colorbar(sm, ax=axes, orientation="horizontal", fraction=0.03, pad=0.02,
                 label=f"the token's advantage Â: white is the episode's A = {A:+.3f}, the ends "
                       f"A ± {lam}·|A| (the same scale in every panel)")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("warmup", help="a warm-up (sft-*) or checkpoint directory")
    ap.add_argument("--out", default="lab/results/credit-v5.png")
    args = ap.parse_args(argv)
    lm, tok = model.load_model(args.warmup, local_files_only=True)
    lm.eval()
    cfg = dict(train.DEFAULTS)
    world, r, adv, lp_s, i = pick_episode(lm, tok, cfg)
    n = int(r.attention_mask[i].sum())
    panels = []
    for title, overrides in PANELS:
        if overrides is None:
            token_adv = adv[:, None] * r.gen_mask
        else:
            settings = dict(cfg, **overrides)
            token_adv, _, _ = evisd.credit(lm, tok, world, r, adv, lp_s, settings)
        panels.append((title, token_adv[i, :n].tolist()))
    ids = r.input_ids[i, :n].tolist()
    tokens = [tok.decode([t]) for t in ids]
    read = [not g for g in r.gen_mask[i, :n].tolist()]
    print(f"episode {i} of its group: reward {r.rewards[i]:.0f}, A = {adv[i]:+.3f}; "
          f"question: {r.questions[i].question}")
    print("| action | text | " + " | ".join(t.split(":")[0] for t, _ in PANELS) + " |")
    print("|---|---|" + "---|" * len(PANELS))
    for s in r.spans[i]:
        text = tok.decode(ids[s.action:s.end]).strip() if s.kind != "invalid" else "(no action)"
        cells = [sum(a[s.start:s.end]) / max(1, s.end - s.start) / adv[i].item()
                 for _, a in panels]
        print(f"| {s.kind} | {text} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    print("wrote", draw(panels, tokens, read, adv[i].item(), cfg["EVISD_LAMBDA"], args.out))


if __name__ == "__main__":
    main(sys.argv[1:])
