"""The supervised warm-up: a random model cannot search, so RL would see reward 0 everywhere. It
imitates the toy world's expert, slips and habits only the reward corrects, and clean demonstrations
under EviSD's privileged context (gold evidence and golden answers are read before a teacher is
asked to). Cached by ``KEYS``: a seed's GRPO and EviSD runs start from the same weights."""
import hashlib
import json
import math
import os
import random
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

import evisd
import model
import rollout
import runs
import toy_world

# The toy's crutches, for the 0.5M embedded model; none is EviSD ("auto": off for an HF model).
# SFT_PRIVILEGED_FRAC: 30% of demonstrations are clean, in the teacher's layout, so the model has
# read a privileged block before EviSD's teacher leans on it (privileged_demonstration).
# SFT_CONTEXT_LOSS: a loss on the tokens read teaches copying. SFT_REPEAT_*: copying comes sooner.

# The warm-up's weights depend on these (and on the embedded model's shape): its cache key.
KEYS = ("MODEL", "SEED", "PREV_TOKEN_INIT", "WORLD_SCALE", "TOP_K", "MAX_TURNS", "SFT_STEPS",
        "SFT_BATCH", "SFT_LR", "SFT_NOISE", "SFT_STOP_EARLY", "SFT_PARTIAL_NAME",
        "SFT_CONTEXT_LOSS", "SFT_REPEAT_STEPS", "SFT_REPEAT_WORLDS", "SFT_PRIVILEGED_FRAC",
        "GRAD_CLIP")


def batch(cfg, tokenizer, step):
    """SFT_BATCH expert episodes of the step's world (fresh, or one of SFT_REPEAT_WORLDS for the
    first SFT_REPEAT_STEPS steps), noisy or clean under EviSD's privileged context, and masks."""
    rng = random.Random(f"warmup-batch/{cfg['SEED']}/{step}")
    # Repeated worlds draw their questions afresh each time.
    index = step % cfg["SFT_REPEAT_WORLDS"] if step < cfg["SFT_REPEAT_STEPS"] else step
    world = toy_world.training_world("warmup", cfg["SEED"], index, cfg["WORLD_SCALE"])
    questions, transcripts, not_read = world.split("train"), [], []
    for _ in range(cfg["SFT_BATCH"]):
        q = rng.choice(questions)
        privileged = rng.random() < cfg["SFT_PRIVILEGED_FRAC"]
        ep = toy_world.expert_episode(q, world, noise=0.0 if privileged else cfg["SFT_NOISE"],
                                      rng=rng, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"],
                                      stop_early=0.0 if privileged else cfg["SFT_STOP_EARLY"],
                                      partial_name=0.0 if privileged else cfg["SFT_PARTIAL_NAME"])
        prompt = model.render_prompt(tokenizer, q)
        tr = rollout.encode_episode(tokenizer, prompt, ep.turns, ep.observations)
        # Out of the context loss: position 0 (nothing predicts it) and the privileged blocks.
        skipped = [0]
        if privileged:
            blocks = evisd.privileged_ids(tokenizer, q, world)
            tr, student_pos = privileged_demonstration(tr, *blocks, rng.choice(("first", "every")),
                                                       rng.choice(("tag", "content")))
            skipped += [j for j, p in enumerate(student_pos) if p < 0]   # -1: a block's token
        transcripts.append(tr)
        not_read.append(skipped)
    b = rollout.collate(transcripts, tokenizer.pad_token_id)
    # The context loss's tokens: what the model reads (prompt, documents), less not_read.
    b["context_mask"] = b["attention_mask"] - b["gen_mask"]
    for i, positions in enumerate(not_read):
        b["context_mask"][i, positions] = 0
    return b


def privileged_demonstration(tr, evidence_ids, answer_ids, evidence_at, answer_at):
    """A clean demonstration with both blocks (read, not written), in every placement a teacher
    uses: the evidence before each search (or the first), the golden answer before or after the
    opening <answer> tag. Returns (Transcript, student_pos) as evisd.insert_blocks does."""
    # where a teacher with these placements puts each block (evisd.block_position)
    placement = {"EVISD_SPAN": "content", "ANSWER_AT": answer_at}
    searches = [evisd.block_position(s, placement) for s in tr.spans if s.kind == "search"]
    inserts = {at: evidence_ids for at in (searches if evidence_at == "every" else searches[:1])}
    for at in (evisd.block_position(s, placement) for s in tr.spans if s.kind == "answer"):
        inserts[at] = inserts.get(at, []) + answer_ids
    out = rollout.Transcript(tr.ids[:tr.prompt_len])
    out.ids, student_pos = evisd.insert_blocks(tr.ids, inserts)
    out.gen = [tr.gen[p] if p >= 0 else 0 for p in student_pos]
    out.info = [tr.info[p] if p >= 0 else 1 for p in student_pos]    # read, never written
    out.kind = [tr.kind[p] if p >= 0 else 0 for p in student_pos]

    def moved(p, first=True):
        """Where p lands: past the blocks inserted before it, and at it unless p ends a range."""
        return p + sum(len(block) for at, block in inserts.items() if at < p + first)
    out.spans = [s._replace(start=moved(s.start), action=moved(s.action),
                            content_start=moved(s.content_start),
                            content_end=max(moved(s.content_start), moved(s.content_end, False)),
                            end=moved(s.end, False)) for s in tr.spans]
    return out, student_pos


def run(cfg, policy, tokenizer, rank=0):
    """Fit ``policy`` to expert transcripts, or load the cached result. Returns the warm-up's path
    (a pretrained model with SFT_STEPS=0: the model's name, no copy of its weights on disk)."""
    if cfg["SFT_STEPS"] == 0 and cfg["MODEL"] not in model.SIZES:
        return cfg["MODEL"]
    key = [cfg[k] for k in KEYS] + [model.SIZES.get(cfg["MODEL"])]    # cached at SFT_DIR-<hash>
    path = f"{cfg['SFT_DIR']}-{hashlib.sha1(json.dumps(key).encode()).hexdigest()[:10]}"
    # Rank 0 alone decides whether to train: if each rank checked the disk itself, a slow rank
    # could find rank 0's fresh save, skip the barrier below, and leave rank 0 waiting forever.
    cached = os.path.isdir(path)
    if rank == 0 and not cached:
        fit(cfg, policy, tokenizer, path)
    if dist.is_initialized():
        dist.barrier()
    if cached or rank != 0:
        try:
            model.put_weights(policy, model.read_weights(path)[0])
        except Exception as e:  # missing or damaged files fail in many ways
            raise SystemExit(f"the cached warm-up {path} is unreadable ({type(e).__name__}: {e}); "
                             "delete that directory and the warm-up is trained again") from None
    return path


def fit(cfg, policy, tokenizer, path):
    """SFT_STEPS steps of AdamW (linear warm-up, cosine decay to 10%), then save to ``path``."""
    t0 = time.perf_counter()
    device, dtype = next(policy.parameters()).device, getattr(torch, cfg["DTYPE"])
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg["SFT_LR"], weight_decay=0.0)
    ramp, steps = max(cfg["SFT_STEPS"] // 10, 1), max(cfg["SFT_STEPS"], 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / ramp, 0.1 + 0.45 * (1 + math.cos(math.pi * s / steps))))
    policy.train()
    bar, losses = tqdm(range(cfg["SFT_STEPS"]), desc="warm-up", dynamic_ncols=True), []
    for step in bar:
        b = batch(cfg, tokenizer, step)
        n_gen, n_context, loss = b["gen_mask"].sum(), b["context_mask"].sum(), 0.0
        optimizer.zero_grad(set_to_none=True)
        # Four quarters sorted by length, each padded to its own longest: far fewer padding tokens.
        for rows in b["attention_mask"].sum(1).argsort().chunk(4):
            width = int(b["attention_mask"][rows].sum(1).max())
            keys = ("input_ids", "attention_mask", "gen_mask", "context_mask")
            ids, att, gen, ctx = (b[k][rows, :width].to(device) for k in keys)
            with model.autocast(device, dtype):
                scored = gen + ctx if cfg["SFT_CONTEXT_LOSS"] else gen
                logp = model.token_logprobs(policy, ids, att, scored)            # [rows, width]
            # The context loss trains copying on the names documents repeat.
            own = -(logp * gen).sum() / n_gen
            (own - cfg["SFT_CONTEXT_LOSS"] * (logp * ctx).sum() / n_context).backward()
            loss += own.item()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg["GRAD_CLIP"])
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss:.3f}")
        losses.append(round(loss, 4))
    # No gradient outlives the warm-up: under LoRA, RL's clipping would count the frozen weights'.
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    print(f"warm-up: {cfg['SFT_STEPS']} steps in {seconds:.1f} s, saved to {path}")
    runs.atomic_save(path, policy, tokenizer, {"config": cfg, "seconds": seconds, "losses": losses})
