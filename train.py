"""Train a search agent with GRPO or EviSD, end to end.

    python train.py                                   # embedded tiny model, CPU or one GPU
    python train.py --METHOD=grpo --SEED=1            # any constant below can be overridden
    python train.py config/qwen2.5-0.5b-instruct.py   # a preset file, then overrides: later wins
    python train.py --OUT_DIR=out/run --resume        # continue from the latest checkpoint
    python train.py --OUT_DIR=out/run --overwrite     # start again, deleting the run that is there
    torchrun --nproc_per_node=4 train.py              # data parallel on 4 GPUs (or CPU gloo)

The constants below are the whole config (runs.py checks overrides and presets against them and
the schema). Stages: world and tokenizer, model, supervised warm-up on expert episodes (cached, so
GRPO and EviSD start from the same weights), then the RL loop: rollout -> rewards -> group
advantages -> (EviSD: teacher re-scoring and the bounded correction) -> clipped policy loss -> AdamW.
"""
import copy
import hashlib
import json
import math
import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

import credit
import evisd
import grpo
import model as M
import real_data as rd
import runs
import search_env as se
import toy_world as tw
from evaluate import heldout_em
from model import autocast
from runs import above, at_least, fraction

# ----------------------------------------------------------------------------- config
# model
MODEL = "tiny"               # "tiny" | "small" | "base" (embedded, built offline) or an HF name/path
METHOD = "evisd"             # "evisd" | "grpo"
SEED = 0
PREV_TOKEN_INIT = 6.0        # embedded model: its first head starts as a previous-token head this sharp (0: off)
# world
FRESH_WORLDS = True          # a new world every step, so facts cannot be memorised
WORLD_SCALE = 1.0            # multiplies the default entity counts of toy_world.make_world
TOP_K = 3                    # documents returned per search
MAX_TURNS = 4                # generated turns per episode
# supervised warm-up
SFT_STEPS = 750
SFT_BATCH = 14
SFT_LR = -1.0                # -1 = auto: 3e-3 embedded, 1e-5 HF model (see AUTO)
SFT_NOISE = 0.4              # chance that an expert demonstration makes one mistake
SFT_STOP_EARLY = 0.5         # chance a two-hop demonstration answers after one hop: a habit only the reward corrects
SFT_PARTIAL_NAME = 0.5       # chance a demonstration searches a person by first name only: a habit too
SFT_PRIVILEGED_FRAC = -1.0   # clean experts shown in the teacher's context; -1 = auto (0.3 tiny, 0 HF)
SFT_CONTEXT_LOSS = -1.0      # weight of a loss on the tokens read; -1 = auto (1 tiny: the names documents repeat teach copying; 0 HF)
SFT_REPEAT_STEPS = -1        # the first this many steps cycle through SFT_REPEAT_WORLDS worlds; -1 = auto (300 tiny,
SFT_REPEAT_WORLDS = 5        # 0 HF: it copies already); repetition makes copying emerge sooner, later steps see fresh worlds
SFT_DIR = "out/sft"          # warm-up checkpoints, one per (seed, model, world, SFT settings)
# RL
RL_STEPS = 60
QUESTIONS_PER_STEP = 8
GROUP_SIZE = 8
LR = -1.0                    # -1 = auto: 2e-4 embedded (5e-4 collapsed, docs/results-v1.md), 1e-6 HF (Search-R1)
KL_COEF = 0.01               # k3 KL to the frozen warm-up model
CLIP_EPS = 0.2
PPO_EPOCHS = 1               # with 1, the ratio is exactly 1 and the clip never acts
GRAD_CLIP = 1.0
MAX_NEW_TOKENS = 48          # per turn
TEMPERATURE = 0.5            # rollouts; the tiny model's sampled reward is 0.12 at 1.0, 0.30 at 0.5
# EviSD
EVISD_EPS = 0.2              # w in [1 - eps, 1 + eps]
EVISD_TAU = 0.0              # |gap| below this is treated as no signal
USE_SEARCH_EVIDENCE = True   # gold evidence before search actions
USE_ANSWER_PRIVILEGE = True  # golden answer before the answer action
EVIDENCE_AT = "every"        # "every": evidence before each search | "first": once, before the first
ANSWER_AT = "content"        # "content": answer block after the opening <answer> | "tag": before it
EVISD_SPAN = "action"        # "action": tag and content corrected | "content": the decision tag keeps A
BOUNDED = True               # False: drop the clip (ablation)
# real data (real_data.py; README "Real data"): the toy world above, or a dataset as distributed
DATA = "toy"                 # "toy" | "hotpotqa" | "2wiki" | "musique" | "jsonl" (Search-R1 / FlashRAG questions)
DATA_TRAIN = ""              # RL questions: hotpot_train_v1.1.json, nq/train.jsonl, ...
DATA_DEV = ""                # what evaluate.py scores: hotpot_dev_distractor_v1.json, nq/dev.jsonl, ...
CORPUS = ""                  # a {"id", "contents"} JSONL, BM25 in memory ("": a HotpotQA question's own paragraphs)
RETRIEVER_URL = ""           # or Search-R1's retrieval server, e.g. http://127.0.0.1:8000/retrieve
EVIDENCE = "auto"            # the teacher's evidence: auto | supporting | answer_passages | answer_only
# evaluation and I/O
EVAL_EVERY = 20
EVAL_QUESTIONS = 50         # per held-out split
EVAL_SEED = 1_000_000        # held-out worlds: this seed and up (training worlds have string names)
VALIDATION_WORLDS = 1000     # seeds EVAL_SEED - 1000 .. EVAL_SEED - 1: for choosing settings, never trained on
CKPT_EVERY = 50
OUT_DIR = "out/run"
# system
DEVICE = "auto"              # "auto" | "cpu" | "cuda" | "cuda:N"
DTYPE = "auto"               # "auto" (bf16 on CUDA if supported) | "float32" | "bfloat16"
GRADIENT_CHECKPOINTING = False  # recompute activations in backward: memory for real models
MAX_BAD_STEPS = 5            # consecutive non-finite losses before stopping

CONFIG_KEYS = [k for k, v in list(globals().items()) if k.isupper() and isinstance(v, (int, float, bool, str))]
DEFAULTS = {k: globals()[k] for k in CONFIG_KEYS}
SCHEMA = runs.Schema(
    choices={"METHOD": ("evisd", "grpo"), "EVIDENCE_AT": ("first", "every"), "ANSWER_AT": ("tag", "content"),
             "EVISD_SPAN": ("action", "content"), "DTYPE": ("auto", "float32", "bfloat16", "float16"),
             "DATA": rd.FORMATS, "EVIDENCE": rd.EVIDENCE_RULES}, checks=(rd.check_config,),
    # Every number's range, checked before any work starts (EVISD_EPS <= 1: beyond, 1 - eps < 0 clips nothing).
    limits={"SEED": ((lambda v: 0 <= v < 2**63), ">= 0 and < 2^63"),   # what torch.manual_seed takes
            "PREV_TOKEN_INIT": at_least(0), "WORLD_SCALE": above(0), "TOP_K": at_least(1), "MAX_TURNS": at_least(1),
            "SFT_STEPS": at_least(0), "SFT_BATCH": at_least(1), "SFT_LR": above(0), "SFT_NOISE": fraction(),
            "SFT_STOP_EARLY": fraction(), "SFT_PARTIAL_NAME": fraction(), "SFT_PRIVILEGED_FRAC": fraction(),
            "SFT_CONTEXT_LOSS": at_least(0), "SFT_REPEAT_STEPS": at_least(0), "SFT_REPEAT_WORLDS": at_least(1),
            "RL_STEPS": at_least(0), "QUESTIONS_PER_STEP": at_least(1), "GROUP_SIZE": at_least(2),
            "LR": above(0), "KL_COEF": at_least(0), "CLIP_EPS": above(0), "PPO_EPOCHS": at_least(1),
            "GRAD_CLIP": above(0), "MAX_NEW_TOKENS": at_least(1), "TEMPERATURE": above(0),
            "EVISD_EPS": ((lambda v: 0 < v <= 1), "> 0 and <= 1"), "EVISD_TAU": at_least(0),
            "EVAL_EVERY": at_least(0), "EVAL_QUESTIONS": at_least(1), "EVAL_SEED": at_least(1),
            "VALIDATION_WORLDS": at_least(1), "CKPT_EVERY": at_least(0), "MAX_BAD_STEPS": at_least(1)},
    # -1 = auto: (embedded model, HF model). A pretrained model must never get rates tuned for 0.5M random weights.
    auto={"SFT_LR": (3e-3, 1e-5), "LR": (2e-4, 1e-6), "SFT_PRIVILEGED_FRAC": (0.3, 0.0), "SFT_CONTEXT_LOSS": (1.0, 0.0),
          "SFT_REPEAT_STEPS": (300, 0)})
# The warm-up's weights depend on these (and on the resolved SFT_PRIVILEGED_FRAC): its cache key.
WARMUP_KEYS = ("MODEL", "SEED", "PREV_TOKEN_INIT", "WORLD_SCALE", "TOP_K", "MAX_TURNS", "SFT_STEPS", "SFT_BATCH", "SFT_LR", "SFT_NOISE",
               "SFT_STOP_EARLY", "SFT_PARTIAL_NAME", "SFT_CONTEXT_LOSS", "SFT_REPEAT_STEPS", "SFT_REPEAT_WORLDS")
# A checkpoint resumed under other values of these would be another experiment spliced onto this
# one, so --resume refuses; any other setting (RL_STEPS, EVAL_EVERY, DEVICE, ...) may change.
RUN_KEYS = WARMUP_KEYS + ("SFT_PRIVILEGED_FRAC", "METHOD", "FRESH_WORLDS")


def configure(argv):
    """(config, resume, overwrite) from the command line, every setting checked (runs.py)."""
    return runs.parse_overrides(argv, DEFAULTS, SCHEMA)


# ----------------------------------------------------------------------------- supervised warm-up
def sft_batch(cfg, tokenizer, step, privileged_frac):
    """Expert episodes from the step's world (fresh, or one of SFT_REPEAT_WORLDS), noisy ones and clean ones
    under EviSD's privileged context in every placement the ablations use, and the context mask."""
    rng = random.Random(f"warmup-batch/{cfg['SEED']}/{step}")
    index = step % cfg["SFT_REPEAT_WORLDS"] if step < cfg["SFT_REPEAT_STEPS"] else step   # its questions drawn afresh
    world = tw.training_world("warmup", cfg["SEED"], index, cfg["WORLD_SCALE"])
    questions, transcripts, inserted = world.split("train"), [], []
    for _ in range(cfg["SFT_BATCH"]):
        q = rng.choice(questions)
        privileged = rng.random() < privileged_frac
        ep = tw.expert_episode(q, world, noise=0.0 if privileged else cfg["SFT_NOISE"], rng=rng,
                               max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"],
                               stop_early=0.0 if privileged else cfg["SFT_STOP_EARLY"],
                               partial_name=0.0 if privileged else cfg["SFT_PARTIAL_NAME"])
        tr = M.encode_episode(tokenizer, M.render_prompt(tokenizer, q), ep.turns, ep.observations)
        not_read = [0]   # out of the context loss: position 0, and privileged blocks (one first try's student wrote them)
        if privileged:
            placement = evisd.Privilege(evidence_at=rng.choice(("first", "every")),
                                        answer_at=rng.choice(("tag", "content")))
            tr, student_pos = evisd.insert_privileged(tr, *evisd.privileged_ids(tokenizer, q, world), placement, tokenizer)
            not_read += [j for j, p in enumerate(student_pos) if p < 0]   # -1: a privileged block's token
        transcripts.append(tr)
        inserted.append(not_read)
    b = M.collate(transcripts, tokenizer.pad_token_id)
    # The context loss's tokens: what the model reads (prompt, documents), less not_read.
    b["context_mask"] = b["attention_mask"] - b["gen_mask"]
    for i, positions in enumerate(inserted):
        b["context_mask"][i, positions] = 0
    return b


def supervised_warmup(cfg, lm, tokenizer, device, dtype, rank):
    """Fit the model to expert transcripts, cached on disk: the loss on its own tokens plus SFT_CONTEXT_LOSS times
    that on the tokens it reads. Returns the warm-up's path (a pretrained model with SFT_STEPS=0: the model)."""
    if cfg["SFT_STEPS"] == 0 and cfg["MODEL"] not in M.SIZES:
        return cfg["MODEL"]   # no warm-up: no copy of a pretrained model's weights on disk
    frac = cfg["SFT_PRIVILEGED_FRAC"]
    # Keyed by the embedded model's shape too; "named worlds": one cached before worlds had names is not reused.
    tag = hashlib.sha1(json.dumps([cfg[k] for k in WARMUP_KEYS] + [frac, "named worlds", M.SIZES.get(cfg["MODEL"])]
                                  ).encode()).hexdigest()[:10]
    path = f"{cfg['SFT_DIR']}-{tag}"
    # Rank 0 alone decides whether to train: if each rank checked the disk itself, a slow rank
    # could find rank 0's fresh save, skip the barrier below, and leave rank 0 waiting forever.
    cached = os.path.isdir(path)
    if rank == 0 and not cached:
        t0 = time.perf_counter()
        opt = torch.optim.AdamW(lm.parameters(), lr=cfg["SFT_LR"], weight_decay=0.0)
        warmup = max(cfg["SFT_STEPS"] // 10, 1)
        sched = torch.optim.lr_scheduler.LambdaLR(  # linear warm-up, cosine decay to 10%
            opt, lambda s: min((s + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * s / max(cfg["SFT_STEPS"], 1)))))
        lm.train()
        bar, losses = tqdm(range(cfg["SFT_STEPS"]), desc="warm-up", dynamic_ncols=True), []
        for step in bar:
            b = sft_batch(cfg, tokenizer, step, frac)
            n_gen, n_context, loss = b["gen_mask"].sum(), b["context_mask"].sum(), 0.0
            opt.zero_grad(set_to_none=True)
            # Four quarters sorted by length, each padded to its own longest: one batch's gradient on ~35% fewer tokens.
            for rows in b["attention_mask"].sum(1).argsort().chunk(4):
                width = int(b["attention_mask"][rows].sum(1).max())
                keys = ("input_ids", "attention_mask", "gen_mask", "context_mask")
                ids, att, gen, ctx = (b[k][rows, :width].to(device) for k in keys)
                with autocast(device, dtype):
                    lp = M.token_logprobs(lm, ids, att, gen + ctx if cfg["SFT_CONTEXT_LOSS"] else gen)
                # The context loss trains copying on the names documents repeat (docs/warmup-probes.md).
                half = -(lp * gen).sum() / n_gen
                (half - cfg["SFT_CONTEXT_LOSS"] * (lp * ctx).sum() / n_context).backward()
                loss += half.item()
            torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg["GRAD_CLIP"])
            opt.step()
            sched.step()
            bar.set_postfix(loss=f"{loss:.3f}")
            losses.append(round(loss, 4))
        seconds = time.perf_counter() - t0
        print(f"warm-up: {cfg['SFT_STEPS']} steps in {seconds:.1f} s, saved to {path}")
        runs.atomic_save(path, lm, tokenizer, {"config": cfg, "privileged_frac": frac, "seconds": seconds, "losses": losses})
    if dist.is_initialized():
        dist.barrier()
    if cached or rank != 0:
        try:
            runs.load_weights(lm, path)
        except Exception as e:  # missing or damaged files fail in many ways
            raise SystemExit(f"the cached warm-up {path} is unreadable ({type(e).__name__}: {e}); "
                             "delete that directory and the warm-up is trained again") from None
    return path


# ----------------------------------------------------------------------------- RL
def collect(cfg, step, lm, tokenizer, device, dtype, rank=0, world_size=1):
    """Sample this step's questions (this rank's shard) and roll out GROUP_SIZE episodes each."""
    runs.seed_everything("rl", cfg["SEED"], step, rank)  # resume gives the same batch
    world = rd.dataset(cfg, "train") if rd.is_real(cfg) else \
        tw.training_world("rl", cfg["SEED"], step if cfg["FRESH_WORLDS"] else 0, cfg["WORLD_SCALE"])
    rng = random.Random(f"rl-batch/{cfg['SEED']}/{step}")
    questions = rng.sample(world.split("train"), cfg["QUESTIONS_PER_STEP"])[rank::world_size]
    env_factory = lambda q: se.SearchEnv(world.retriever(q), q, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"])
    with autocast(device, dtype):
        r = M.rollout(lm, tokenizer, env_factory, questions, cfg["GROUP_SIZE"], cfg["MAX_TURNS"],
                      cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
    return r, world


def update(cfg, r, world, policy, lm, ref, tokenizer, opt, device, dtype):
    """Advantages, (EviSD) teacher re-scoring, and PPO_EPOCHS passes of the policy loss."""
    adv = grpo.group_advantages(r.rewards, cfg["GROUP_SIZE"]).to(device)      # [N]
    b = {k: getattr(r, k).to(device) for k in ("input_ids", "attention_mask", "gen_mask", "action_kind")}
    ref_logp = None
    if cfg["KL_COEF"] > 0:
        with torch.no_grad(), autocast(device, dtype):
            ref_logp = M.token_logprobs(ref, b["input_ids"], b["attention_mask"], b["gen_mask"],
                                        temperature=cfg["TEMPERATURE"])          # [N, T]
    lm.train()
    metrics, t_teacher = {}, 0.0
    for epoch in range(cfg["PPO_EPOCHS"]):
        with autocast(device, dtype):
            logp = policy(b["input_ids"], b["attention_mask"], b["gen_mask"], cfg["TEMPERATURE"])  # [N, T]
        if epoch == 0:
            # The batch was sampled by these very weights: the old-policy log-probs are free,
            # and they are also the student's log-probs that EviSD compares with the teacher.
            old_logp = logp.detach()
            t1 = time.perf_counter()
            with autocast(device, dtype):   # GRPO: A on every generated token; EviSD: the teacher's Â
                token_adv, ev_stats, _ = evisd.step_advantages(lm, tokenizer, cfg, world, r, adv, old_logp)
            metrics.update(ev_stats)
            t_teacher = time.perf_counter() - t1 if cfg["METHOD"] == "evisd" else 0.0
        loss, stats = grpo.policy_loss(logp, old_logp, ref_logp, token_adv, b["gen_mask"],
                                       cfg["CLIP_EPS"], cfg["KL_COEF"])
        finite = torch.isfinite(loss.detach()).float()
        if dist.is_initialized():  # all ranks skip together, or DDP's gradient sync would hang
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if not finite:
            metrics["nonfinite_loss"] = 1
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg["GRAD_CLIP"])
        opt.step()
    metrics.update(reward=r.rewards.mean().item(), loss=loss.item(), **stats,
                   turns=r.turns.float().mean().item(), tokens=int(r.attention_mask.sum()),
                   gen_tokens=int(r.gen_mask.sum()), teacher_s=t_teacher,
                   answered=sum(a is not None for a in r.answers) / len(r.answers))
    metrics["em"] = metrics["reward"]   # the reward is exact match
    # What the policy does, by the world's oracle: premature answers, missed searches, ...
    metrics.update(credit.label_shares(credit.episode_labels(r, world, cfg["TOP_K"])))
    return metrics


# Averaged over ranks under DDP; the gap statistics and label shares stay those of rank 0's shard.
REDUCED = ("reward", "em", "loss", "kl", "clip_frac", "ratio", "turns", "answered", "tokens",
           "gen_tokens", "modulated_frac")


def rl_step(cfg, step, policy, lm, ref, tokenizer, opt, device, dtype, rank=0, world_size=1):
    """One RL step: collect, then update. Returns the step's metrics."""
    t0 = time.perf_counter()
    r, world = collect(cfg, step, lm, tokenizer, device, dtype, rank, world_size)
    t_rollout = time.perf_counter() - t0
    metrics = update(cfg, r, world, policy, lm, ref, tokenizer, opt, device, dtype)
    if world_size > 1:
        runs.average_over_ranks(metrics, REDUCED, device)
    metrics.update(step=step, step_s=time.perf_counter() - t0, rollout_s=t_rollout)
    return metrics


# ----------------------------------------------------------------------------- the run
def build_model(cfg, device):
    """(policy, tokenizer): the embedded model built offline from the toy world, or an HF model."""
    runs.seed_everything(cfg["SEED"])
    if cfg["MODEL"] in M.SIZES:
        tokenizer = M.build_tokenizer(M.tokenizer_texts())
        lm = M.build_model(tokenizer, cfg["MODEL"], seed=cfg["SEED"], prev_token_init=cfg["PREV_TOKEN_INIT"])
    else:
        # float32 weights, whatever the checkpoint's dtype: autocast computes in DTYPE, and an
        # LR of 1e-6 moves a weight far less than bf16 can represent (8 mantissa bits: 0.4%).
        lm, tokenizer = M.load_model(cfg["MODEL"], dtype=torch.float32)
    if cfg["GRADIENT_CHECKPOINTING"]:
        M.enable_checkpointing(lm)
    return lm.to(device), tokenizer


def main(argv):
    cfg, resume, overwrite = configure(argv)
    rank, world_size, device, dtype = runs.setup(cfg)
    out = cfg["OUT_DIR"]
    # OUT_DIR and the resume point are settled before the warm-up, so a mistake stops in seconds.
    resumed = runs.open_run(cfg, resume, overwrite, RUN_KEYS, rank)   # (path, model, tokenizer, state)
    if rank == 0:
        print(json.dumps(cfg))

    # 1. tokenizer and model, 2. supervised warm-up (shared by GRPO and EviSD runs of a seed)
    lm, tokenizer = build_model(cfg, device)
    sft_path = supervised_warmup(cfg, lm, tokenizer, device, dtype, rank)
    # lm holds the warm-up weights now; the frozen copy for the KL computes in DTYPE only
    ref = copy.deepcopy(lm).to(dtype).eval().requires_grad_(False) if cfg["KL_COEF"] > 0 else None

    # 3. RL, resumable
    opt = torch.optim.AdamW(lm.parameters(), lr=cfg["LR"], weight_decay=0.0)
    start, bad_steps = runs.restore(resumed, lm, opt, rank) if resumed else (0, 0)
    del resumed
    policy = grpo.SyncedPolicy(lm)
    if dist.is_initialized():
        policy = torch.nn.parallel.DistributedDataParallel(policy)
    if rank == 0:
        runs.start_metrics(out, resume, start, cfg)

    def save(step):
        if rank == 0:
            runs.save_checkpoint(out, step, lm, tokenizer, {"optimizer": opt.state_dict(), "bad_steps": bad_steps,
                                                          "config": cfg, "sft_path": sft_path})

    def quick_check(step):
        em = heldout_em(lm, tokenizer, cfg, n=cfg["EVAL_QUESTIONS"], device=device, dtype=dtype)
        runs.log_metrics(out, {"step": step, "eval": True, **{f"eval_{k}": v for k, v in em.items()}})
        return em

    done, stopped = start, None   # done: steps whose update the weights hold, what a stop saves
    bar = tqdm(range(start, cfg["RL_STEPS"]), desc=cfg["METHOD"], disable=rank != 0, dynamic_ncols=True)
    try:
        if start == 0 and cfg["EVAL_EVERY"] and rank == 0:
            bar.write(f"step 0 (warm-up): held-out EM {quick_check(0)}")
        for step in bar:
            m = rl_step(cfg, step, policy, lm, ref, tokenizer, opt, device, dtype, rank, world_size)
            bad_steps = bad_steps + 1 if m.get("nonfinite_loss") else 0
            if rank == 0:
                runs.log_metrics(out, m)
                bar.set_postfix(reward=f"{m['reward']:.2f}", kl=f"{m['kl']:.3f}")
            if bad_steps >= cfg["MAX_BAD_STEPS"]:
                raise SystemExit(f"stopping: {bad_steps} consecutive steps had a NaN/inf loss "
                                 "(updates skipped); try a lower LR or DTYPE=float32")
            done = step + 1
            if cfg["EVAL_EVERY"] and rank == 0 and (done % cfg["EVAL_EVERY"] == 0 or done == cfg["RL_STEPS"]):
                bar.write(f"step {done}: held-out EM {quick_check(done)}")
            if (cfg["CKPT_EVERY"] and done % cfg["CKPT_EVERY"] == 0) or done == cfg["RL_STEPS"]:
                save(done)
    except (KeyboardInterrupt, rd.RetrieverError) as e:   # saves the steps done, then stops
        stopped = e
        if rank == 0:
            print(f"\ninterrupted: saving step {done} to {out}")
        save(done)
    if cfg["RL_STEPS"] == 0:
        save(0)
    if rank == 0:
        print(f"saved {out}/ckpt-{done:06d} after {done} RL steps; evaluate it: python evaluate.py {out}")
    if dist.is_initialized():
        # Free DDP's reducer, then tear down together: else one rank hung at exit in 4 of 11 runs.
        del policy
        dist.barrier()
        dist.destroy_process_group()
    if isinstance(stopped, runs.Terminated):
        raise SystemExit(128 + signal.SIGTERM)
    if isinstance(stopped, rd.RetrieverError):
        raise SystemExit(f"{stopped}; step {done} is saved in {out}: --resume continues once the server answers")
    return lm


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, runs.stop_on_sigterm)
    try:
        main(sys.argv[1:])
    except runs.Terminated:  # outside the RL loop (the warm-up, say), which saves on its own
        print("terminated before a checkpoint could be saved", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    except KeyboardInterrupt:
        raise SystemExit("interrupted before a checkpoint could be saved") from None
