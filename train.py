"""Train a search agent with GRPO or EviSD, end to end.

    python train.py                                   # embedded tiny model, CPU or one GPU
    python train.py --METHOD=grpo --SEED=1            # any constant below can be overridden
    python train.py config/qwen2.5-0.5b-instruct.py   # a preset file, then overrides: later wins
    python train.py --OUT_DIR=out/run --resume        # continue from the latest checkpoint
    python train.py --OUT_DIR=out/run --overwrite     # start again, deleting the run that is there
    torchrun --nproc_per_node=4 train.py              # data parallel on 4 GPUs (or CPU gloo)

The constants below are the whole config; a preset under config/ is a file of plain
``NAME = value`` lines, read (never executed) and checked like ``--NAME=value``. Stages, top
to bottom: world and tokenizer, model, supervised warm-up on expert episodes (cached, so GRPO
and EviSD start from the same weights), then the RL loop: rollout -> rewards -> group
advantages -> (EviSD: teacher re-scoring and the bounded correction) -> clipped policy loss ->
AdamW.
"""
import ast
import copy
import hashlib
import json
import math
import os
import random
import shutil
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

import credit
import evisd
import grpo
import model as M
import search_env as se
import toy_world as tw
from evaluate import VALIDATION_WORLDS, checkpoints, heldout_em, load_checkpoint, read_metrics
from model import autocast

# ----------------------------------------------------------------------------- config
# model
MODEL = "tiny"               # "tiny" | "small" | "base" (embedded, built offline) or an HF name/path
METHOD = "evisd"             # "evisd" | "grpo"
SEED = 0
# world
FRESH_WORLDS = True          # a new world every step, so facts cannot be memorised
WORLD_SCALE = 1.0            # multiplies the default entity counts of toy_world.make_world
TOP_K = 3                    # documents returned per search
MAX_TURNS = 4                # generated turns per episode
# supervised warm-up
SFT_STEPS = 900
SFT_BATCH = 16
SFT_LR = -1.0                # -1 = auto: 3e-3 embedded, 1e-5 HF model (see AUTO)
SFT_NOISE = 0.4              # chance that an expert demonstration makes one mistake
SFT_STOP_EARLY = 0.5         # chance that a two-hop demonstration answers after one hop: a habit
SFT_PARTIAL_NAME = 0.5       # chance that a demonstration searches a person by first name only: a habit
                             # greedy imitation inherits and only the reward can correct
SFT_PRIVILEGED_FRAC = -1.0   # clean experts shown in the teacher's context; -1 = auto (0.3 tiny, 0 HF)
SFT_DIR = "out/sft"          # warm-up checkpoints, one per (seed, model, world, SFT settings)
# RL
RL_STEPS = 60
QUESTIONS_PER_STEP = 8
GROUP_SIZE = 8
LR = -1.0                    # -1 = auto: 2e-4 embedded (5e-4 collapsed, README), 1e-6 HF (Search-R1)
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
# evaluation and I/O
EVAL_EVERY = 20
EVAL_QUESTIONS = 50         # per held-out split
EVAL_SEED = 1_000_000        # held-out worlds: this seed and up (RL worlds below, warm-up 2,000,000+)
CKPT_EVERY = 50
OUT_DIR = "out/run"
# system
DEVICE = "auto"              # "auto" | "cpu" | "cuda" | "cuda:N"
DTYPE = "auto"               # "auto" (bf16 on CUDA if supported) | "float32" | "bfloat16"
GRADIENT_CHECKPOINTING = False  # recompute activations in backward: memory for real models
MAX_BAD_STEPS = 5            # consecutive non-finite losses before stopping

CHOICES = {"METHOD": ("evisd", "grpo"), "EVIDENCE_AT": ("first", "every"), "ANSWER_AT": ("tag", "content"),
           "EVISD_SPAN": ("action", "content"), "DTYPE": ("auto", "float32", "bfloat16", "float16")}
# Settings whose -1 means auto: (embedded model, HF model). A pretrained model must never get
# the embedded model's rates, which are tuned for 1M random weights and would wreck it.
AUTO = {"SFT_LR": (3e-3, 1e-5), "LR": (2e-4, 1e-6), "SFT_PRIVILEGED_FRAC": (0.3, 0.0)}
CONFIG_KEYS = [k for k, v in list(globals().items())
               if k.isupper() and isinstance(v, (int, float, bool, str)) and k != "CHOICES"]
# The warm-up's weights depend on these (and on the resolved SFT_PRIVILEGED_FRAC): its cache key.
WARMUP_KEYS = ("MODEL", "SEED", "WORLD_SCALE", "TOP_K", "MAX_TURNS", "SFT_STEPS", "SFT_BATCH",
               "SFT_LR", "SFT_NOISE", "SFT_STOP_EARLY", "SFT_PARTIAL_NAME")
# A checkpoint resumed under other values of these would be another experiment spliced onto this
# one, so --resume refuses; any other setting (RL_STEPS, EVAL_EVERY, DEVICE, ...) may change.
RUN_KEYS = WARMUP_KEYS + ("SFT_PRIVILEGED_FRAC", "METHOD", "FRESH_WORLDS")


def check_setting(name, value, text, defaults, where=""):
    """``value`` for setting ``name`` if its type is the default's (an int is fine for a float);
    otherwise stop with a message naming the setting, what was given and what is allowed.
    ``text`` is the value as written; ``where`` names the config file and line it came from."""
    if name not in defaults:
        raise SystemExit(f"{where}unknown setting {name!r}; allowed: {', '.join(sorted(defaults))}")
    default = defaults[name]
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not type(default):
        raise SystemExit(f"{where}{name}={text!r}: expected {type(default).__name__} "
                         f"like the default {default!r}, got {type(value).__name__}")
    if name in CHOICES and value not in CHOICES[name]:
        raise SystemExit(f"{where}{name}={value!r}: allowed values are {', '.join(CHOICES[name])}")
    return value


def read_config_file(path, defaults):
    """The settings of a preset file: ``NAME = literal`` lines (and a docstring), parsed with
    ast and never executed, so a config file cannot run code; each checked by check_setting."""
    if not os.path.isfile(path):
        raise SystemExit(f"no config file {path!r}; the presets are config/*.py")
    source = open(path).read()
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise SystemExit(f"{path}, line {e.lineno}: not a valid config file: {e.msg}") from None
    settings = {}
    for node in tree.body:
        where = f"{path}, line {node.lineno}: "
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue                                      # a docstring
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            raise SystemExit(f"{where}only plain assignments NAME = value are allowed, got "
                             f"{ast.get_source_segment(source, node)!r}")
        name, text = node.targets[0].id, ast.get_source_segment(source, node.value)
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            raise SystemExit(f"{where}{name}: the value must be a literal (a number, a quoted "
                             f"string, True or False), got {text!r}") from None
        settings[name] = check_setting(name, value, text, defaults, where)
    return settings


def parse_overrides(argv, defaults):
    """Config files (``config/NAME.py``) and ``--NAME=value`` overrides, applied in order (a
    later one wins) and type-checked against the defaults; also ``--resume`` and ``--overwrite``.
    Returns (config, resume, overwrite)."""
    config, flags = dict(defaults), set()
    for arg in argv:
        if arg in ("--resume", "--overwrite"):
            flags.add(arg[2:])
        elif arg.startswith("--") and "=" in arg:
            name, text = arg[2:].split("=", 1)
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text                      # a bare word: a string
            config[name] = check_setting(name, value, text, defaults)
        elif arg.endswith(".py"):
            config.update(read_config_file(arg, defaults))
        else:
            raise SystemExit(f"bad argument {arg!r}: use --NAME=value, a config file "
                             "(config/NAME.py), --resume or --overwrite")
    if not (config["DEVICE"] in ("auto", "cpu", "cuda") or config["DEVICE"].startswith("cuda:")):
        raise SystemExit(f"DEVICE={config['DEVICE']!r}: allowed values are auto, cpu, cuda, cuda:N")
    for name in ("SFT_STEPS", "RL_STEPS", "EVAL_EVERY", "CKPT_EVERY"):
        if config[name] < 0:
            raise SystemExit(f"{name} must be >= 0, got {config[name]}")
    first_reserved = config["EVAL_SEED"] - VALIDATION_WORLDS
    if config["SEED"] < 0 or config["SEED"] * 100_000 + config["RL_STEPS"] >= first_reserved:
        raise SystemExit(f"SEED={config['SEED']}: training worlds (seeds SEED * 100,000 + step) must "
                         f"stay below the validation and held-out worlds (seeds {first_reserved} and up); "
                         f"use a SEED from 0 to {(first_reserved - config['RL_STEPS'] - 1) // 100_000}")
    if config["GROUP_SIZE"] < 2:
        raise SystemExit(f"GROUP_SIZE must be >= 2 (GRPO compares samples), got {config['GROUP_SIZE']}")
    if flags == {"resume", "overwrite"}:
        raise SystemExit("--resume continues the run in OUT_DIR and --overwrite deletes it: give one")
    embedded = config["MODEL"] in M.SIZES
    for name, (for_embedded, for_hf) in AUTO.items():      # -1 = auto, resolved once, here
        if config[name] < 0:
            config[name] = for_embedded if embedded else for_hf
    return config, "resume" in flags, "overwrite" in flags


# ----------------------------------------------------------------------------- helpers
def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states():
    """Every RNG the run touches, for the checkpoint (steps also reseed from SEED and the step
    number, so resuming does not depend on these, but a checkpoint should be complete)."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states):
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def pick_device(cfg):
    if cfg["DEVICE"] == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = cfg["DEVICE"]
    if device.startswith("cuda") and dist.is_initialized():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    dtype = cfg["DTYPE"]
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") and torch.cuda.is_bf16_supported() else "float32"
    return torch.device(device), getattr(torch, dtype)


def atomic_save(path, model, tokenizer, state):
    """Write a checkpoint directory under a temporary name, then rename it into place."""
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    M.save_checkpoint_dir(model, tokenizer, tmp)
    torch.save(state, os.path.join(tmp, "state.pt"))
    old = path + ".old"
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def load_weights(lm, path):
    """Copy the weights of the HF checkpoint at ``path`` into ``lm`` in place."""
    lm.load_state_dict(M.AutoModelForCausalLM.from_pretrained(path).state_dict())


def prune_checkpoints(out_dir, keep=2):
    """Keep the newest ``keep`` checkpoints (an older one to fall back on if the newest is
    damaged); delete older ones and the leftovers (.tmp, .old) of interrupted saves."""
    kept = checkpoints(out_dir)[-keep:]
    for name in os.listdir(out_dir):
        if name.startswith("ckpt-") and os.path.join(out_dir, name) not in kept:
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)


def check_out_dir(cfg, resume, overwrite, rank):
    """Stop before a fresh run writes over the one already in OUT_DIR; --overwrite deletes it."""
    out = cfg["OUT_DIR"]
    if resume or not os.path.isdir(out):
        return
    held = [os.path.basename(c) for c in checkpoints(out)]
    rows = read_metrics(out)
    if rows:
        held.append(f"metrics.jsonl with {len(rows)} rows")
    if held and not overwrite:
        raise SystemExit(f"{out} already holds a run ({', '.join(held)}). Continue it with --resume, "
                         "give another --OUT_DIR, or pass --overwrite to delete it and start again.")
    if held and rank == 0:
        print(f"--overwrite: deleting {', '.join(held)} in {out}")
        for name in os.listdir(out):
            if name.startswith("ckpt-"):
                shutil.rmtree(os.path.join(out, name))
        if rows:
            os.remove(os.path.join(out, "metrics.jsonl"))


def check_resume_config(saved, cfg, ckpt, rank):
    """Stop when a setting in RUN_KEYS differs from the checkpoint's; note the others that do."""
    diff = {k: f"{k}={cfg[k]!r} (checkpoint: {saved.get(k)!r})" for k in cfg
            if k != "OUT_DIR" and saved.get(k) != cfg[k]}   # a moved run directory is the same run
    defining = [v for k, v in diff.items() if k in RUN_KEYS]
    if defining:
        raise SystemExit(f"--resume: {ckpt} is another run: {', '.join(defining)}. Resume with the "
                         "checkpoint's values, or start a new run in another OUT_DIR.")
    if diff and rank == 0:
        print(f"--resume: continuing {ckpt} with changed settings: {', '.join(diff.values())}")


def stop_on_sigterm(signum, frame):
    """Schedulers and preemptible machines stop a job with SIGTERM: save and exit as on Ctrl-C."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the save short
    raise KeyboardInterrupt


class SyncedPolicy(torch.nn.Module):
    """The policy's log-prob forward as a module, so DDP can wrap it and sync gradients."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, score_mask, temperature=1.0):
        return M.token_logprobs(self.lm, input_ids, attention_mask, score_mask, temperature=temperature)


# ----------------------------------------------------------------------------- supervised warm-up
def sft_batch(cfg, tokenizer, step, privileged_frac):
    """Expert episodes from one fresh world: noisy ones as they are, and a fraction of clean
    ones under EviSD's privileged context, so the model learns to read that context. Its blocks
    go to every placement the ablations use (EVIDENCE_AT, ANSWER_AT), so one warm-up per seed
    serves them all."""
    rng = random.Random(cfg["SEED"] * 7919 + step)
    world = tw.make_world(2_000_000 + cfg["SEED"] * 100_000 + step, scale=cfg["WORLD_SCALE"])
    questions = world.split("train")
    transcripts = []
    for _ in range(cfg["SFT_BATCH"]):
        q = rng.choice(questions)
        privileged = rng.random() < privileged_frac
        ep = tw.expert_episode(q, world, noise=0.0 if privileged else cfg["SFT_NOISE"], rng=rng,
                               max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"],
                               stop_early=0.0 if privileged else cfg["SFT_STOP_EARLY"],
                               partial_name=0.0 if privileged else cfg["SFT_PARTIAL_NAME"])
        tr = M.encode_episode(tokenizer, M.render_prompt(tokenizer, q), ep.turns, ep.observations)
        if privileged:
            placement = evisd.Privilege(evidence_at=rng.choice(("first", "every")),
                                        answer_at=rng.choice(("tag", "content")))
            tr, _ = evisd.insert_privileged(tr, *evisd.privileged_ids(tokenizer, q, world), placement, tokenizer)
        transcripts.append(tr)
    return M.collate(transcripts, tokenizer.pad_token_id)


def supervised_warmup(cfg, lm, tokenizer, device, dtype, rank):
    """Fit the model to expert transcripts (loss on generated tokens only); cached on disk.
    Returns the warm-up's path: for a pretrained model with SFT_STEPS=0, the model itself."""
    if cfg["SFT_STEPS"] == 0 and cfg["MODEL"] not in M.SIZES:
        return cfg["MODEL"]   # no warm-up: no copy of a pretrained model's weights on disk
    frac = cfg["SFT_PRIVILEGED_FRAC"]
    tag = hashlib.sha1(json.dumps([cfg[k] for k in WARMUP_KEYS] + [frac]).encode()).hexdigest()[:10]
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
        bar = tqdm(range(cfg["SFT_STEPS"]), desc="warm-up", dynamic_ncols=True)
        for step in bar:
            b = sft_batch(cfg, tokenizer, step, frac)
            n_gen, loss = b["gen_mask"].sum(), 0.0
            opt.zero_grad(set_to_none=True)
            # Two halves sorted by length, each padded only to its own longest episode: the same
            # gradient as one padded batch, for about 15% less compute.
            for rows in b["attention_mask"].sum(1).argsort().chunk(2):
                width = int(b["attention_mask"][rows].sum(1).max())
                ids, att, gen = (b[k][rows, :width].to(device) for k in ("input_ids", "attention_mask", "gen_mask"))
                with autocast(device, dtype):
                    lp = M.token_logprobs(lm, ids, att, gen)
                half = -(lp * gen).sum() / n_gen
                half.backward()
                loss += half.item()
            torch.nn.utils.clip_grad_norm_(lm.parameters(), cfg["GRAD_CLIP"])
            opt.step()
            sched.step()
            bar.set_postfix(loss=f"{loss:.3f}")
        seconds = time.perf_counter() - t0
        print(f"warm-up: {cfg['SFT_STEPS']} steps in {seconds:.1f} s, saved to {path}")
        atomic_save(path, lm, tokenizer, {"config": cfg, "privileged_frac": frac, "seconds": seconds})
    if dist.is_initialized():
        dist.barrier()
    if cached or rank != 0:
        try:
            load_weights(lm, path)
        except Exception as e:  # missing or damaged files fail in many ways
            raise SystemExit(f"the cached warm-up {path} is unreadable ({type(e).__name__}: {e}); "
                             "delete that directory and the warm-up is trained again") from None
    return path


# ----------------------------------------------------------------------------- RL
def collect(cfg, step, lm, tokenizer, device, dtype, rank=0, world_size=1):
    """Sample this step's questions (this rank's shard) and roll out GROUP_SIZE episodes each."""
    seed_everything(cfg["SEED"] * 1_000_003 + step * 101 + rank)  # resume gives the same batch
    world = tw.make_world(cfg["SEED"] * 100_000 + (step if cfg["FRESH_WORLDS"] else 0), scale=cfg["WORLD_SCALE"])
    questions = random.Random(cfg["SEED"] * 7 + step).sample(world.split("train"), cfg["QUESTIONS_PER_STEP"])
    questions = questions[rank::world_size]
    env_factory = lambda q: se.SearchEnv(world, q, max_turns=cfg["MAX_TURNS"], top_k=cfg["TOP_K"])
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
            if cfg["METHOD"] == "evisd":
                t1 = time.perf_counter()
                with autocast(device, dtype):
                    token_adv, ev_stats, _ = evisd.step_advantages(lm, tokenizer, cfg, world, r, adv, old_logp)
                metrics.update(ev_stats)
                t_teacher = time.perf_counter() - t1
            else:
                token_adv = adv[:, None] * b["gen_mask"]                          # [N, T]
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
        keys = [k for k in REDUCED if k in metrics]
        vals = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
        dist.all_reduce(vals)
        metrics.update({k: v / world_size for k, v in zip(keys, vals.tolist())})
    metrics.update(step=step, step_s=time.perf_counter() - t0, rollout_s=t_rollout)
    return metrics


def main(argv):
    defaults = {k: globals()[k] for k in CONFIG_KEYS}
    cfg, resume, overwrite = parse_overrides(argv, defaults)
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if ddp:
        dist.init_process_group("nccl" if torch.cuda.is_available() and cfg["DEVICE"] != "cpu" else "gloo")
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    if ddp and rank == 0:
        print(f"DDP: {world_size} processes, backend {dist.get_backend()}")
    if cfg["QUESTIONS_PER_STEP"] % world_size:
        raise SystemExit(f"QUESTIONS_PER_STEP={cfg['QUESTIONS_PER_STEP']} must divide by the "
                         f"{world_size} processes")
    device, dtype = pick_device(cfg)
    # The cores are split between the ranks; OMP_NUM_THREADS, when set, wins.
    threads = int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, (os.cpu_count() or 1) // world_size)
    torch.set_num_threads(threads)
    # OUT_DIR and the resume point are settled before the warm-up, so a mistake stops in seconds.
    check_out_dir(cfg, resume, overwrite, rank)
    resumed = load_checkpoint(cfg["OUT_DIR"]) if resume else None   # (path, model, tokenizer, state)
    if resumed:
        check_resume_config(resumed[3]["config"], cfg, resumed[0], rank)
    os.makedirs(cfg["OUT_DIR"], exist_ok=True)
    if rank == 0:
        print(json.dumps(cfg))

    # 1. tokenizer and model
    seed_everything(cfg["SEED"])
    if cfg["MODEL"] in M.SIZES:
        tokenizer = M.build_tokenizer(M.tokenizer_texts())
        lm = M.build_model(tokenizer, cfg["MODEL"], seed=cfg["SEED"])
    else:
        # float32 weights, whatever the checkpoint's dtype: autocast computes in DTYPE, and an
        # LR of 1e-6 moves a weight far less than bf16 can represent (8 mantissa bits: 0.4%).
        lm, tokenizer = M.load_model(cfg["MODEL"], dtype=torch.float32)
    if cfg["GRADIENT_CHECKPOINTING"]:
        M.enable_checkpointing(lm)
    lm.to(device)

    # 2. supervised warm-up (shared by GRPO and EviSD runs of the same seed)
    sft_path = supervised_warmup(cfg, lm, tokenizer, device, dtype, rank)
    ref = None
    if cfg["KL_COEF"] > 0:  # lm holds the warm-up weights now; the copy computes in DTYPE only
        ref = copy.deepcopy(lm).to(dtype).eval().requires_grad_(False)

    # 3. RL, resumable
    opt = torch.optim.AdamW(lm.parameters(), lr=cfg["LR"], weight_decay=0.0)
    start, bad_steps = 0, 0
    if resumed:
        ckpt, ckpt_lm, _, state = resumed
        lm.load_state_dict(ckpt_lm.state_dict())
        del resumed, ckpt_lm
        opt.load_state_dict(state["optimizer"])
        start, bad_steps = state["step"], state["bad_steps"]
        set_rng_states(state["rng"])
        if rank == 0:
            print(f"resumed from {ckpt} at step {start}")
    elif resume and rank == 0:
        print(f"--resume: no readable checkpoint in {cfg['OUT_DIR']}; starting from the warm-up, "
              "after the rows already in its metrics.jsonl")
    policy = SyncedPolicy(lm)
    if ddp:
        policy = torch.nn.parallel.DistributedDataParallel(policy)
    log_path = os.path.join(cfg["OUT_DIR"], "metrics.jsonl")
    if rank == 0:
        # --resume keeps the log's rows up to the checkpoint it continues from (all of them when
        # there is none), less any unreadable line; rewritten under another name, then renamed,
        # so that no kill can leave the log half-written.
        kept = read_metrics(cfg["OUT_DIR"]) if resume else []
        if start:
            kept = [r for r in kept if r["step"] < start or (r["step"] == start and r.get("eval"))]
        with open(log_path + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        os.replace(log_path + ".tmp", log_path)
        with open(os.path.join(cfg["OUT_DIR"], "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)

    def save(step):
        if rank == 0:
            atomic_save(os.path.join(cfg["OUT_DIR"], f"ckpt-{step:06d}"), lm, tokenizer,
                        {"optimizer": opt.state_dict(), "step": step, "bad_steps": bad_steps,
                         "config": cfg, "sft_path": sft_path, "rng": rng_states()})
            prune_checkpoints(cfg["OUT_DIR"])

    def evaluate(step):
        em = heldout_em(lm, tokenizer, cfg, n=cfg["EVAL_QUESTIONS"], device=device, dtype=dtype)
        row = {"step": step, "eval": True, **{f"eval_{k}": v for k, v in em.items()}}
        with open(log_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        return em

    done = start   # steps whose update the weights hold: what an interruption saves
    bar = tqdm(range(start, cfg["RL_STEPS"]), desc=cfg["METHOD"], disable=rank != 0, dynamic_ncols=True)
    try:
        if start == 0 and cfg["EVAL_EVERY"] and rank == 0:
            em = evaluate(0)
            bar.write(f"step 0 (warm-up): held-out EM {em}")
        for step in bar:
            m = rl_step(cfg, step, policy, lm, ref, tokenizer, opt, device, dtype, rank, world_size)
            bad_steps = bad_steps + 1 if m.get("nonfinite_loss") else 0
            if rank == 0:
                with open(log_path, "a") as f:
                    f.write(json.dumps(m) + "\n")
                bar.set_postfix(reward=f"{m['reward']:.2f}", em=f"{m['em']:.2f}", kl=f"{m['kl']:.3f}")
            if bad_steps >= cfg["MAX_BAD_STEPS"]:
                raise SystemExit(f"stopping: {bad_steps} consecutive steps had a NaN/inf loss "
                                 "(updates skipped); try a lower LR or DTYPE=float32")
            done = step + 1
            if cfg["EVAL_EVERY"] and rank == 0 and (done % cfg["EVAL_EVERY"] == 0 or done == cfg["RL_STEPS"]):
                bar.write(f"step {done}: held-out EM {evaluate(done)}")
            if (cfg["CKPT_EVERY"] and done % cfg["CKPT_EVERY"] == 0) or done == cfg["RL_STEPS"]:
                save(done)
    except KeyboardInterrupt:
        if rank == 0:
            print(f"\ninterrupted: saving step {done} to {cfg['OUT_DIR']}")
        save(done)
    if cfg["RL_STEPS"] == 0:
        save(0)
    if ddp:
        # Free DDP's reducer, then tear the group down together: without this, one rank hung at
        # exit after the other had finished in 4 of 11 two-process test runs (0 of 14 with it).
        del policy
        dist.barrier()
        dist.destroy_process_group()
    return lm


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:  # outside the RL loop (the warm-up, say), which saves on its own
        raise SystemExit("interrupted before a checkpoint could be saved") from None
