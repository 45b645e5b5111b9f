"""Measure what EviSD costs beside GRPO, and what multi-turn rollouts cost beside one generate.

    python lab/bench.py                       # tiny and small embedded configs, random weights
    python lab/bench.py --model out/sft-XXXX  # a trained checkpoint: real episode lengths, actions
    python lab/bench.py --sizes tiny --repeats 3
    python lab/bench.py --sizes tiny --GROUP_SIZE=4 --json out/bench.json   # train.py overrides

For each config, on one batch of QUESTIONS x GROUP episodes:
* rollout tokens/s of ``model.rollout`` beside one plain ``model.generate`` call that writes the
  same number of tokens (forced with min_new_tokens);
* teacher re-scoring seconds, and the update (advantages, [teacher], loss, backward, AdamW)
  for METHOD=grpo and METHOD=evisd on the same batch: train.rl_step itself, its rollout
  replaced by that batch;
* the full step = rollout + update, and peak memory.
With random weights the update batch is made of noisy expert episodes (real lengths, real action
spans, mixed rewards), because an untrained model writes no actions for the teacher to score.
Warm-up first, then the median of ``--repeats`` timed runs. The last line prints the ratios.
"""
import argparse
import contextlib
import copy
import json
import os
import resource
import statistics
import sys
import time
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model  # noqa: E402
import runs  # noqa: E402
import search_env  # noqa: E402
import toy_world  # noqa: E402
import train  # noqa: E402
import warmup  # noqa: E402


def timed(fn, repeats):
    fn()                                              # warm-up (allocations, kernels)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


@contextlib.contextmanager
def fixed_batch(world, batch):
    """A context in which train.rl_step trains on ``batch`` from ``world`` instead of drawing a
    world and rolling out: what is timed or measured is the update alone."""
    with mock.patch.object(train, "step_world", lambda cfg, step: world), \
            mock.patch.object(train.model, "rollout", lambda *args, **kwargs: batch):
        yield


def update_seconds(cfg, policy, tok, batch, world, repeats):
    """(median seconds, metrics) of train.rl_step on a fixed batch: its world and rollout are
    replaced by ``world`` and ``batch``, so what is timed is the update alone."""
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    policy = copy.deepcopy(policy)          # the same starting weights for every method
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg["LR"])
    with fixed_batch(world, batch):
        seconds, (metrics, record) = timed(
            lambda: train.rl_step(cfg, 0, policy, reference, tok, optimizer), repeats)
    return seconds, dict(metrics, **train.measure_beside(cfg, record))


def bench_config(name, lm, tok, cfg, device, dtype, repeats, trained):
    lm.to(device)
    world = toy_world.make_world(123, scale=cfg["WORLD_SCALE"])
    questions = world.split("train")[:cfg["QUESTIONS_PER_STEP"]]

    def do_rollout():
        torch.manual_seed(0)
        envs = search_env.episodes(world, questions, cfg["GROUP_SIZE"], cfg["MAX_TURNS"],
                                   cfg["TOP_K"])
        with model.autocast(device, dtype):
            return model.rollout(lm, tok, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
    rollout_s, r = timed(do_rollout, repeats)
    gen_tokens = int(r.gen_mask.sum())

    # One plain generate call writing the same number of tokens from the same prompts.
    prompts = [tok.encode(model.render_prompt(tok, q)) for q in questions
               for _ in range(cfg["GROUP_SIZE"])]
    L = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (L - len(p)) + p for p in prompts], device=device)
    mask = (ids != tok.pad_token_id).long()
    per_row = max(1, round(gen_tokens / len(prompts)))

    def do_generate():
        torch.manual_seed(0)
        with torch.no_grad(), model.autocast(device, dtype):
            return lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0,
                               max_new_tokens=per_row, min_new_tokens=per_row,
                               pad_token_id=tok.pad_token_id)
    generate_s, _ = timed(do_generate, repeats)

    batch = r if trained else warmup.expert_rollouts(cfg, tok, world, questions)
    results = {method: update_seconds(dict(cfg, METHOD=method), lm, tok, batch, world, repeats)
               for method in ("grpo", "evisd")}
    if device.type == "cuda":
        peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB (GPU)"
    else:
        peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (RSS)"
    grpo_update, (evisd_update, ev_metrics) = results["grpo"][0], results["evisd"]
    return dict(config=name, params=sum(p.numel() for p in lm.parameters()),
                episodes=len(prompts), update_tokens=int(batch.attention_mask.sum()),
                gen_tokens=gen_tokens, rollout_tok_s=gen_tokens / rollout_s,
                generate_tok_s=per_row * len(prompts) / generate_s,
                rollout_s=rollout_s, teacher_s=ev_metrics["teacher_s"],
                modulated_frac=ev_metrics["modulated_frac"],
                grpo_step_s=rollout_s + grpo_update, evisd_step_s=rollout_s + evisd_update,
                peak=peak)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,small", help="embedded configs to measure")
    ap.add_argument("--model", default=None, help="a trained HF checkpoint directory instead")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="also write the rows and ratios to this file")
    # the rest: train.py's --NAME=value overrides
    args, config_args = ap.parse_known_args()
    overrides = (config_args + [f"--DEVICE={args.device}"]
                 + ([f"--MODEL={args.model}"] if args.model else []))
    cfg, _, _ = train.configure(overrides)   # train.py's defaults, auto LRs resolved
    device, dtype = runs.pick_device(cfg)
    rows = []
    if args.model:
        lm, tok = model.load_model(args.model, local_files_only=True)
        rows.append(bench_config(args.model, lm, tok, cfg, device, dtype, args.repeats,
                                 trained=True))
    else:
        tok = model.build_tokenizer(model.tokenizer_texts())
        for size in args.sizes.split(","):
            rows.append(bench_config(size, model.build_model(tok, size), tok, cfg, device, dtype,
                                     args.repeats, trained=False))
    cols = ["config", "params", "episodes", "update_tokens", "rollout_tok_s", "generate_tok_s",
            "rollout_s", "teacher_s", "grpo_step_s", "evisd_step_s", "modulated_frac", "peak"]
    print(f"device={device} dtype={dtype} repeats={args.repeats} (median)")
    print("| " + " | ".join(cols) + " |\n" + "|---" * len(cols) + "|")
    for row in rows:
        print("| " + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])
                                for c in cols) + " |")
    step_ratio = statistics.mean(r["evisd_step_s"] / r["grpo_step_s"] for r in rows)
    gen_ratio = statistics.mean(r["rollout_tok_s"] / r["generate_tok_s"] for r in rows)
    print(f"evisd_step_over_grpo_step={step_ratio:.2f} rollout_over_generate={gen_ratio:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "dtype": str(dtype), "repeats": args.repeats,
                       "rows": rows, "evisd_step_over_grpo_step": step_ratio,
                       "rollout_over_generate": gen_ratio}, f, indent=1)


if __name__ == "__main__":
    main()
