"""Measure what EviSD costs beside GRPO, and what multi-turn rollouts cost beside one generate.

    python lab/bench.py                       # tiny and small embedded configs, random weights
    python lab/bench.py --model out/sft-XXXX  # a trained checkpoint: real episode lengths, actions
    python lab/bench.py --sizes tiny --repeats 3
    python lab/bench.py --sizes tiny --GROUP_SIZE=4 --json out/bench.json   # train.py overrides
    python lab/bench.py --shapes qwen2.5-0.5b --decodes compiled,static,generate --rollout-only
                                            # rollouts only, Qwen2.5-0.5B's shape too (a GPU)

For each config, on one batch of QUESTIONS x GROUP episodes:
* rollout tokens/s of each decode path (``--decodes``, train.DECODE's values: "generate", the
  core's rollout.rollout; "static" and "compiled", lab/fast_decode.py's decoders) beside one
  plain ``model.generate`` call that writes the same number of tokens (forced with
  min_new_tokens), timed in turns (A B C A B C ...) so a busy machine slows all alike;
* the roofline: each decode step reads every weight once, so a rollout takes at least
  weight bytes x decode steps / memory bandwidth (a copy's, measured here); each rollout's
  ``of_roofline`` is that time over its own;
* teacher re-scoring seconds, and the update (advantages, [teacher], loss, backward, AdamW)
  for METHOD=grpo and METHOD=evisd on the same batch: train.rl_step itself, its rollout
  replaced by that batch;
* the full step = rollout + update, and peak memory.
With random weights the update batch is made of noisy expert episodes (real lengths, real action
spans, mixed rewards), because an untrained model writes no actions for the teacher to score.
``--shapes`` adds random models of lab/gpu_memory.py's Qwen shapes (the embedded tokenizer: their
sampled text is mostly ids it has no text for, so every turn runs to MAX_NEW_TOKENS).
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
import rollout  # noqa: E402
import runs  # noqa: E402
import search_env  # noqa: E402
import toy_world  # noqa: E402
import train  # noqa: E402
from lab import expert  # noqa: E402
from lab import fast_decode  # noqa: E402

# train.DECODE's values and the rollout function each plays
PLAYS = {"generate": rollout.rollout, **{name: fast_decode.decoder(name)
                                         for name in fast_decode.NAMES}}


def timed(fn, repeats):
    fn()                                              # warm-up (allocations, kernels)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def timed_in_turns(fns, repeats):
    """{name: (median seconds, last output)} of the functions ``fns`` {name: fn}, each warmed up
    once, then timed in turns (A B A B ...), so a slower spell of the machine hits all alike."""
    outs = {name: fn() for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            outs[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return {name: (statistics.median(times[name]), outs[name]) for name in fns}


def copy_bandwidth(device, mb=256):
    """Bytes/s of one large tensor copy on ``device`` (read + write): the memory bandwidth a
    decode step's weight reads can reach at best."""
    src = torch.ones(mb * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / best


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_steps(do_rollout):
    """How many forward passes (prefills and one-token steps) a rollout of the static path
    makes: each reads every weight once."""
    calls = []
    forward = fast_decode.cached_forward
    with mock.patch.object(fast_decode, "cached_forward",
                           lambda *args: calls.append(1) or forward(*args)):
        do_rollout("static")
    return len(calls)


@contextlib.contextmanager
def fixed_batch(world, batch):
    """A context in which train.rl_step trains on ``batch`` (of ``world``'s questions) instead
    of rolling out, whatever its DECODE: what is timed or measured is the update alone."""
    with (mock.patch.object(train.rollout, "rollout", lambda *args, **kwargs: batch),
          mock.patch.object(fast_decode, "decoder", lambda name: lambda *args, **kw: batch)):
        yield


def update_seconds(cfg, policy, tok, batch, world, repeats):
    """(median seconds, metrics) of train.rl_step on a fixed batch: its world and rollout are
    replaced by ``world`` and ``batch``, so what is timed is the update alone."""
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    policy = copy.deepcopy(policy)          # the same starting weights for every method
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg["LR"])
    with fixed_batch(world, batch):
        seconds, (metrics, _) = timed(
            lambda: train.rl_step(cfg, 0, world, policy, reference, tok, optimizer), repeats)
    return seconds, metrics


def bench_config(name, lm, tok, cfg, device, dtype, repeats, trained, decodes, rollout_only,
                 bandwidth):
    lm.to(device)
    world = toy_world.make_world(123, scale=cfg["WORLD_SCALE"])
    questions = world.split("train")[:cfg["QUESTIONS_PER_STEP"]]

    def do_rollout(decode):
        torch.manual_seed(0)
        envs = search_env.episodes(world, questions, cfg["GROUP_SIZE"], cfg["MAX_TURNS"],
                                   cfg["TOP_K"])
        with model.autocast(device, dtype):
            return PLAYS[decode](lm, tok, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
    r = do_rollout(decodes[0])
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
            out = lm.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=0,
                              max_new_tokens=per_row, min_new_tokens=per_row,
                              pad_token_id=tok.pad_token_id)
        sync(device)
        return out
    fns = {f"rollout_{d}": (lambda d=d: do_rollout(d)) for d in decodes}
    seconds = timed_in_turns(dict(fns, generate=do_generate), repeats)
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.parameters())
    # the fastest a rollout (its decode steps) or the plain generate (per_row steps) can be
    floor_s = {"rollout": weight_bytes * decode_steps(do_rollout) / bandwidth,
               "generate": weight_bytes * per_row / bandwidth}
    row = dict(config=name, params=sum(p.numel() for p in lm.parameters()),
               episodes=len(prompts), gen_tokens=gen_tokens,
               generate_tok_s=per_row * len(prompts) / seconds["generate"][0],
               generate_of_roofline=floor_s["generate"] / seconds["generate"][0],
               roofline_rollout_s=floor_s["rollout"])
    for d in decodes:
        s, out = seconds[f"rollout_{d}"]
        row.update({f"rollout_{d}_tok_s": int(out.gen_mask.sum()) / s, f"rollout_{d}_s": s,
                    f"rollout_{d}_of_roofline": floor_s["rollout"] / s})
    # the decode path train.py runs (the first asked for) is the rollout of the step columns
    rollout_s = row[f"rollout_{decodes[0]}_s"]
    row.update(rollout_tok_s=row[f"rollout_{decodes[0]}_tok_s"], rollout_s=rollout_s)
    if rollout_only:
        return row

    batch = r if trained else expert.expert_rollouts(cfg, tok, world, questions)
    results = {method: update_seconds(dict(cfg, METHOD=method), lm, tok, batch, world, repeats)
               for method in ("grpo", "evisd")}
    if device.type == "cuda":
        peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB (GPU)"
    else:
        peak = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (RSS)"
    grpo_update, (evisd_update, ev_metrics) = results["grpo"][0], results["evisd"]
    return dict(row, update_tokens=int(batch.attention_mask.sum()),
                teacher_s=ev_metrics["teacher_s"], modulated_frac=ev_metrics["modulated_frac"],
                grpo_step_s=rollout_s + grpo_update, evisd_step_s=rollout_s + evisd_update,
                peak=peak)


def number(v):
    """A table cell: rates as whole numbers, fractions to 3 significant digits."""
    if not isinstance(v, float):
        return str(v)
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def qwen_shaped(shape, tok):
    """A random model of one of lab/gpu_memory.py's Qwen shapes (Qwen2.5-0.5B's: hidden 896, 24
    layers, 14 heads, 2 kv heads, MLP 4864, vocab 151,936, tied embeddings)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from lab import gpu_memory
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(
        **gpu_memory.SHAPES[shape], **gpu_memory.COMMON_SHAPE, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,small", help="embedded configs to measure")
    ap.add_argument("--shapes", default="",
                    help="random models of lab/gpu_memory.py's Qwen shapes, e.g. qwen2.5-0.5b")
    ap.add_argument("--model", default=None, help="a trained HF checkpoint directory instead")
    ap.add_argument("--decodes", default="generate,static",
                    help=f"rollout decode paths, from {','.join(PLAYS)}; the first is "
                    "the one the step columns use")
    ap.add_argument("--rollout-only", action="store_true", help="no update timings")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="also write the rows and ratios to this file")
    # the rest: train.py's --NAME=value overrides
    args, config_args = ap.parse_known_args()
    decodes = args.decodes.split(",")
    if not set(decodes) <= set(PLAYS):
        ap.error(f"--decodes {args.decodes}: each must be one of {', '.join(PLAYS)}")
    overrides = (config_args + [f"--DEVICE={args.device}"]
                 + ([f"--MODEL={args.model}"] if args.model else []))
    cfg, _, _ = train.configure(overrides)   # train.py's defaults, auto LRs resolved
    device, dtype = runs.pick_device(cfg)
    bandwidth = copy_bandwidth(device)
    rows = []
    measure = dict(cfg=cfg, device=device, dtype=dtype, repeats=args.repeats, decodes=decodes,
                   rollout_only=args.rollout_only, bandwidth=bandwidth)
    if args.model:
        lm, tok = model.load_model(args.model, local_files_only=True)
        rows.append(bench_config(args.model, lm, tok, trained=True, **measure))
    else:
        tok = model.build_tokenizer(model.tokenizer_texts())
        for size in filter(None, args.sizes.split(",")):
            rows.append(bench_config(size, model.build_model(tok, size), tok, trained=False,
                                     **measure))
        for shape in filter(None, args.shapes.split(",")):
            rows.append(bench_config(f"{shape}-shape", qwen_shaped(shape, tok), tok,
                                     trained=False, **measure))
    cols = (["config", "params", "episodes"]
            + [f"rollout_{d}_tok_s" for d in decodes] + ["generate_tok_s"]
            + [f"rollout_{d}_of_roofline" for d in decodes] + ["generate_of_roofline"]
            + ([] if args.rollout_only else
               ["update_tokens", "rollout_s", "teacher_s", "grpo_step_s", "evisd_step_s",
                "modulated_frac", "peak"]))
    print(f"device={device} dtype={dtype} repeats={args.repeats} (median, in turns) "
          f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    print("| " + " | ".join(cols) + " |\n" + "|---" * len(cols) + "|")
    for row in rows:
        print("| " + " | ".join(number(row[c]) for c in cols) + " |")
    ratios = {f"rollout_{d}_over_generate":
              statistics.mean(r[f"rollout_{d}_tok_s"] / r["generate_tok_s"] for r in rows)
              for d in decodes}
    if not args.rollout_only:
        ratios["evisd_step_over_grpo_step"] = statistics.mean(
            r["evisd_step_s"] / r["grpo_step_s"] for r in rows)
    print(" ".join(f"{k}={v:.2f}" for k, v in ratios.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "dtype": str(dtype), "repeats": args.repeats,
                       "copy_bandwidth_gb_s": bandwidth / 1e9, "rows": rows, **ratios}, f,
                      indent=1)


if __name__ == "__main__":
    main()
