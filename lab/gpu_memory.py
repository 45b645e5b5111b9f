"""One memory probe of the GPU check (lab/gpu_check.py runs each in its own process): a
randomly initialised model of a Qwen2.5 shape put through RL updates of the Qwen preset
(reference and policy forward, backward, teacher scoring, AdamW) on a synthetic batch at the
worst case docs/one-gpu.md's memory table assumes; peak memory beside that page's estimate.
Every weight trains, or with ``--lora RANK`` a LoRA adapter on a base frozen in the compute dtype.

    python lab/gpu_memory.py qwen2.5-0.5b --checkpointing 1 --json out/mem.json   # on CUDA
    python lab/gpu_memory.py qwen2.5-7b --lora 16 --json out/mem.json             # on CUDA
    python lab/gpu_memory.py tiny --dry --json out/mem.json                       # CPU, tiny sizes
    # the CPU: a Qwen2.5 shape cut to 8 layers (two or three depths give a formula's terms)
    python lab/gpu_memory.py qwen2.5-0.5b --dry --layers 8 --lora 16 --updates 1 --json out/m.json
"""
import argparse
import contextlib
import json
import os
import random
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from lab import measure  # noqa: E402
import model  # noqa: E402
import rollout  # noqa: E402
import runs  # noqa: E402
import search_env  # noqa: E402
import toy_world  # noqa: E402
import train  # noqa: E402
from lab import bench  # noqa: E402

# Qwen2.5's config.json values (Qwen2.5-{0.5B,1.5B,3B,7B}-Instruct), so the memory probe builds
# the exact shapes at random with no download. ``tiny`` is the dry mode's stand-in.
SHAPES = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                       num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       tie_word_embeddings=True),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       tie_word_embeddings=False),
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}
COMMON_SHAPE = dict(max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6)
# The worst case of the memory table (docs/one-gpu.md): the Qwen preset's 8 questions x 5 samples,
# each a ~120-token prompt, MAX_TURNS=4 turns of MAX_NEW_TOKENS=500 and 3 observations of ~150
# tokens.
PROMPT_TOKENS, OBSERVATION_TOKENS = 120, 150
# What docs/one-gpu.md estimated (GB), and the dry mode's batch.
README_ESTIMATE_GB = {("qwen2.5-0.5b", True): 21, ("qwen2.5-1.5b", True): 51}
DRY_ROLLOUT = ["--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=2", "--MAX_NEW_TOKENS=40", "--MAX_TURNS=3"]


def worst_case_rollouts(cfg, tok, world, prompt_tokens, observation_tokens):
    """A Rollouts batch at its longest: every episode uses all MAX_TURNS turns of MAX_NEW_TOKENS
    (thinking, then a search, and an answer last) with full observations between them. The text
    is the toy world's, so the teacher's evidence blocks are real; every group has mixed rewards,
    so A != 0 everywhere and the teacher scores every episode (its worst case too)."""
    rng = random.Random(0)
    words = tok.encode(" ".join(d.text for d in world.docs), add_special_tokens=False)

    def filler(n):                           # n ordinary tokens from a random place in the corpus
        start = rng.randrange(len(words) - n)
        return words[start:start + n]

    questions = [q for q in world.split("train") if q.hops == 2][:cfg["QUESTIONS_PER_STEP"]]
    think = tok.encode("<think>", add_special_tokens=False)
    transcripts, episodes = [], []
    for q in questions:
        for _ in range(cfg["GROUP_SIZE"]):
            tr = rollout.Transcript(filler(prompt_tokens))
            for turn in range(cfg["MAX_TURNS"]):
                kind = "answer" if turn == cfg["MAX_TURNS"] - 1 else "search"
                action = tok.encode(f"</think><answer> {q.answers[0]} </answer>" if kind == "answer"
                                    else f"</think><search> {q.question} </search>",
                                    add_special_tokens=False)
                ids = think + filler(cfg["MAX_NEW_TOKENS"] - len(think) - len(action)) + action
                text = tok.decode(ids)
                tr.add_turn(ids, kind, turn,
                            rollout.action_ranges(tok, ids, text, search_env.parse_action(text)),
                            filler(observation_tokens) if kind == "search" else [])
            transcripts.append(tr)
            episodes.append(q)
    n = len(transcripts)
    rewards = torch.tensor([float(i % 2) for i in range(n)])
    return rollout.Rollouts(**rollout.collate(transcripts, tok.pad_token_id), rewards=rewards,
                            answers=[q.answers[0] for q in episodes],
                            turns=torch.full((n,), cfg["MAX_TURNS"]), questions=episodes,
                            em=rewards)


@contextlib.contextmanager
def default_dtype(dtype):
    """A context in which new floating-point tensors are ``dtype``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def probe_memory(shape, checkpointing, dry, path, lora_rank=0, layers=None, updates=2):
    """``updates`` RL updates (EviSD, the Qwen preset) of a random model of ``shape`` (with
    ``layers`` decoder layers, if given) on the worst-case batch, every weight trained or, with
    ``lora_rank``, a LoRA adapter: peak memory, memory held between steps, seconds per update;
    written to ``path``."""
    preset = os.path.join(ROOT, "config", "qwen2.5-0.5b-instruct.py")
    cfg, _, _ = train.configure([preset, f"--DEVICE={'cpu' if dry else 'cuda'}",
                                 f"--LORA_RANK={lora_rank}"] + (DRY_ROLLOUT if dry else []))
    device, dtype = runs.pick_device(cfg)
    prompt_tokens, observation_tokens = (20, 20) if dry else (PROMPT_TOKENS, OBSERVATION_TOKENS)
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    world = toy_world.make_world(0)
    batch = worst_case_rollouts(cfg, tok, world, prompt_tokens, observation_tokens)
    dims = {**SHAPES[shape], "num_hidden_layers": layers or SHAPES[shape]["num_hidden_layers"]}
    config = Qwen2Config(**dims, **COMMON_SHAPE, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    # float32 weights, as train.py holds the policy; under LoRA the frozen base in the compute
    # dtype, built in it, so a 7B model never exists in float32.
    with torch.device(device), default_dtype(dtype if lora_rank else torch.float32):
        lm = Qwen2ForCausalLM(config)
    if checkpointing:
        model.enable_checkpointing(lm)
    if lora_rank:
        lm = model.add_lora(lm, lora_rank, cfg["LORA_ALPHA"], dtype, shape)
    ref = train.frozen_reference(lm)
    trained = [p for p in lm.parameters() if p.requires_grad]   # all, or the adapter's
    opt = torch.optim.AdamW(trained, lr=cfg["LR"], weight_decay=0.0)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    seconds, steps = [], []
    # train.rl_step itself, its world and rollout replaced by the worst-case batch.
    with bench.fixed_batch(world, batch):
        for _ in range(updates):
            t0 = time.perf_counter()
            metrics, record = train.rl_step(cfg, 0, world, lm, ref, tok, opt)
            if cuda:
                torch.cuda.synchronize()
            seconds.append(round(time.perf_counter() - t0, 2))
            steps.append(metrics)
    metrics.update(measure.gap_stats(record["adv"], record["gap"], record["token_adv"],
                                   batch.gen_mask.to(device), batch.action_kind.to(device)))
    params = sum(p.numel() for p in lm.parameters())             # the adapter's too, under LoRA
    trainable = sum(p.numel() for p in trained)
    hidden, mlp = dims["hidden_size"], dims["intermediate_size"]
    tokens = int(batch.attention_mask.numel())
    # The estimate's formula (docs/one-gpu.md): 20 bytes per parameter (float32 weight, gradient,
    # AdamW's two moments, the float32 reference); under LoRA the frozen base once in its dtype
    # (it is the reference too) and 16 bytes per adapter parameter. With checkpointing, each
    # layer's bf16 input, one layer's recompute and one 2^27-logit chunk of the head.
    weights = ((params - trainable) * dtype.itemsize + 16 * trainable if lora_rank
               else 20 * params)
    estimate = weights + (
        tokens * (2 * hidden * dims["num_hidden_layers"] + 2 * (7 * hidden + 4 * mlp))
        + 4 * 2**27 if checkpointing else 0)
    measured_shape = not lora_rank and dims == SHAPES[shape]   # the shapes the table lists
    result = {"params": params, "trainable_params": trainable, "lora_rank": lora_rank,
              "layers": dims["num_hidden_layers"], "episodes": batch.input_ids.shape[0],
              "tokens_per_episode": batch.input_ids.shape[1], "update_s": seconds,
              "kl_step0": steps[0]["kl"],
              "modulated_frac": round(metrics.get("modulated_frac", 0.0), 3),
              "finite_loss": all(m.get("nonfinite_loss", 0) == 0 for m in steps),
              "readme_formula_gb": round(estimate / 1e9, 1) if checkpointing else None,
              "readme_table_gb": (README_ESTIMATE_GB.get((shape, checkpointing))
                                  if measured_shape else None)}
    if cuda:
        result["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
        result["held_between_steps_gb"] = round(torch.cuda.memory_allocated() / 1e9, 2)
    else:
        result["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 2)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def at_least_one(text):
    """argparse's type for a count that must be >= 1."""
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text} is not >= 1")
    return int(text)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--checkpointing", type=int, default=1, help="1: GRADIENT_CHECKPOINTING on")
    ap.add_argument("--dry", action="store_true", help="CPU and a tiny batch")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK",
                    help="> 0: train a LoRA adapter of this rank, the base frozen in the compute "
                         "dtype (0: every weight, in float32)")
    ap.add_argument("--layers", type=at_least_one, default=None,
                    help="decoder layers (default: the shape's own)")
    ap.add_argument("--updates", type=at_least_one, default=2, help="RL updates to measure")
    ap.add_argument("--json", required=True, help="where the figures go")
    args = ap.parse_args(argv)
    if args.lora < 0:
        ap.error(f"--lora {args.lora}: a rank is >= 1, or 0 for no adapter")
    probe_memory(args.shape, bool(args.checkpointing), args.dry, args.json, args.lora,
                 args.layers, args.updates)


if __name__ == "__main__":
    main(sys.argv[1:])
