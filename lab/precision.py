"""How much bf16 rounding moves EviSD's correction: the share of the correction's mass that
changes when the student's and the teacher's log-probs are computed under bf16 autocast (every
GPU run) instead of float32, on the same sampled episodes.

    python lab/precision.py out/evisd-s0                   # a run's newest checkpoint, CPU
    python lab/precision.py out/run --device cuda --experts   # what lab/gpu_check.py runs

For each action kind (search, answer) over the content tokens m of episodes with A != 0, with
c = Â - A the correction (evisd.evisd_correction):

    share = sum |c_bf16 - c_float32| / sum |c_float32|

A share of 0.03 means rounding moves 3% of the correction's mass. Also the largest and the 99th
percentile |gap error| and the 50th and 99th percentile of |gap| itself (float32). The gap is
heavy-tailed: most tokens have |gap| near 0 and tanh(tau * gap) saturates on the tail, which is
why a rounding error of tenths of a nat moves little of the mass. lab/tests/test_rounding.py keeps
the share under 10% on a trained embedded model.
"""
import argparse
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import evisd  # noqa: E402
import grpo  # noqa: E402
import model  # noqa: E402
import rollout  # noqa: E402
import runs  # noqa: E402
import search_env  # noqa: E402
import train  # noqa: E402
from lab import expert  # noqa: E402

KINDS = ("search", "answer")


def batch_scores(policy, tokenizer, world, r, adv, settings, dtype):
    """The student's log-probs [N, T], the teacher's [N, T] and Â [N, T] of one batch, each
    computed under ``dtype`` autocast on the policy's device."""
    device = next(policy.parameters()).device
    with torch.no_grad(), model.autocast(device, dtype):
        lp_s = model.token_logprobs(policy, r.input_ids.to(device), r.attention_mask.to(device),
                                    r.gen_mask.to(device), temperature=settings["TEMPERATURE"])
        token_adv, lp_t, _ = evisd.credit(policy, tokenizer, world, r, adv.to(device), lp_s,
                                          settings)
    return lp_s.float().cpu(), lp_t.float().cpu(), token_adv.float().cpu()


def rounding(policy, tokenizer, batches, settings, dtype=torch.bfloat16):
    """Rounding's share of the correction's mass per action kind, over ``batches`` [(world,
    Rollouts, A [N])], and the gap's error and size: {kind: {share, tokens, max_gap_error,
    p99_gap_error, p50_gap, p99_gap}}."""
    parts = {kind: {"moved": 0.0, "mass": 0.0, "errors": [], "gaps": []} for kind in KINDS}
    for world, r, adv in batches:
        exact = batch_scores(policy, tokenizer, world, r, adv, settings, torch.float32)
        rounded = batch_scores(policy, tokenizer, world, r, adv, settings, dtype)
        plain = adv[:, None] * r.gen_mask
        m = evisd.correction_mask(r, settings) & (adv[:, None] != 0)
        for kind in KINDS:
            sel = m & (r.action_kind == rollout.KIND_IDS[kind])
            c32, c16 = (exact[2] - plain)[sel], (rounded[2] - plain)[sel]
            gap32 = (exact[1] - exact[0])[sel]
            gap16 = (rounded[1] - rounded[0])[sel]
            p = parts[kind]
            p["moved"] += (c16 - c32).abs().sum().item()
            p["mass"] += c32.abs().sum().item()
            p["errors"].append((gap16 - gap32).abs())
            p["gaps"].append(gap32.abs())
    out = {}
    for kind, p in parts.items():
        errors, gaps = torch.cat(p["errors"]), torch.cat(p["gaps"])
        if not len(gaps):
            out[kind] = {"tokens": 0}
            continue
        out[kind] = {"share": p["moved"] / p["mass"] if p["mass"] else 0.0, "tokens": len(gaps),
                     "max_gap_error": errors.max().item(),
                     "p99_gap_error": errors.quantile(0.99).item(),
                     "p50_gap": gaps.quantile(0.5).item(), "p99_gap": gaps.quantile(0.99).item()}
    return out


def sampled_batches(policy, tokenizer, cfg, n_batches, seed=0):
    """Training batches as train.rl_step samples them (QUESTIONS_PER_STEP x GROUP_SIZE at
    TEMPERATURE, float32), each in a fresh training world: [(world, Rollouts, A [N])]."""
    out = []
    for b in range(n_batches):
        world = train.step_world(cfg, 10_000 + b)   # past any run's steps: worlds it never saw
        questions = random.Random(f"precision/{seed}/{b}").sample(world.split("train"),
                                                                   cfg["QUESTIONS_PER_STEP"])
        envs = search_env.episodes(world, questions, cfg["GROUP_SIZE"], cfg["MAX_TURNS"],
                                   cfg["TOP_K"])
        torch.manual_seed(seed * 1_000 + b)
        r = rollout.rollout(policy, tokenizer, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
        out.append((world, r, grpo.group_advantages(r.rewards, cfg["GROUP_SIZE"])))
    return out


def expert_batches(tokenizer, cfg, n_batches):
    """Batches of noisy expert episodes (lab/expert.py: real action spans, mixed
    rewards) instead of sampled ones: for a briefly trained model that writes few actions."""
    out = []
    for b in range(n_batches):
        world = train.step_world(cfg, 10_000 + b)
        questions = random.Random(f"precision/{b}").sample(world.split("train"),
                                                           cfg["QUESTIONS_PER_STEP"])
        r = expert.expert_rollouts(cfg, tokenizer, world, questions, seed=b)
        out.append((world, r, grpo.group_advantages(r.rewards, cfg["GROUP_SIZE"])))
    return out


def table(result):
    lines = ["| action kind | content tokens (A ≠ 0) | rounding's share of the correction | "
             "largest gap error | 99th pct gap error | median gap | 99th pct gap |",
             "|---|---|---|---|---|---|---|"]
    for kind, v in result.items():
        if v["tokens"]:
            lines.append(f"| {kind} | {v['tokens']} | {v['share']:.3f} | "
                         f"{v['max_gap_error']:.3f} | {v['p99_gap_error']:.3f} | "
                         f"{v['p50_gap']:.3f} | {v['p99_gap']:.2f} |")
        else:
            lines.append(f"| {kind} | 0 |" + " – |" * 5)
    if not any(v["tokens"] for v in result.values()):
        lines.append("\nno episode with A ≠ 0 wrote a search or an answer: nothing to measure "
                     "(more --batches; --experts scores noisy expert episodes instead)")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run directory (its newest checkpoint) or a checkpoint")
    ap.add_argument("--batches", type=int, default=3, help="training batches to sample")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--experts", action="store_true",
                    help="noisy expert episodes instead of the model's own samples")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    policy, tokenizer, cfg, _ = runs.load_run(args.run)
    policy = policy.to(args.device)
    batches = (expert_batches(tokenizer, cfg, args.batches) if args.experts
               else sampled_batches(policy, tokenizer, cfg, args.batches))
    result = rounding(policy, tokenizer, batches, cfg)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
