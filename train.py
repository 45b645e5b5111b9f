"""Train a search agent with GRPO or EviSD, end to end.

    python train.py                                   # embedded tiny model, CPU or one GPU
    python train.py --METHOD=grpo --LORA_RANK=16      # any constant below can be overridden
    python train.py config/qwen2.5-0.5b-instruct.py   # a preset file, then overrides: later wins
    python train.py --OUT_DIR=out/run --resume        # continue (--overwrite: start again)
    torchrun --nproc_per_node=4 train.py              # data parallel on 4 GPUs (or CPU gloo)

The constants below are the whole config. Then the model, the supervised warm-up (cached: GRPO
and EviSD start from the same weights) and the RL loop, one ``rl_step`` per step.
"""
import copy
import importlib.util
import json
import os
import random
import signal
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

import evaluate
import evisd
import grpo
import model
import rollout
import runs
import search_env
import toy_world
import warmup
from runs import above, at_least, fraction

# ----------------------------------------------------------------------------- config
# model and method
MODEL = "tiny"               # "tiny" | "small" | "base" (embedded, built offline) or an HF name
METHOD = "evisd"             # "evisd" | "grpo" | a peer's rule from the lab (PEERS below)
SEED = 0
# world
FRESH_WORLDS = True          # a new world every step, so facts cannot be memorised
WORLD_SCALE = 1.0            # multiplies the default entity counts of toy_world.make_world
TOP_K = 3                    # documents returned per search
MAX_TURNS = 4                # generated turns per episode
# supervised warm-up (warmup.py). "auto": the embedded model's value, or an HF model's.
SFT_STEPS = 750
SFT_BATCH = 14
SFT_LR = "auto"              # 3e-3 embedded, 1e-5 HF
SFT_NOISE = 0.4              # chance that an expert demonstration makes one mistake
SFT_STOP_EARLY = 0.5         # a habit only the reward corrects: answering a 2-hop question early
SFT_PARTIAL_NAME = 0.5       # another: searching a person by the first name only
SFT_DIR = "out/sft"          # warm-up checkpoints, one per (seed, model, world, SFT settings)
# The toy's crutches: they let the 0.5M embedded model learn to copy and to read a privileged
# block in minutes. None is part of EviSD; "auto" turns each off for an HF model (warmup.py).
PREV_TOKEN_INIT = 6.0        # layer 0 starts with a previous-token head this sharp (0: off)
SFT_CONTEXT_LOSS = "auto"    # weight of a loss on the tokens read (it teaches copying): 1 | 0 HF
SFT_REPEAT_STEPS = "auto"    # the first 300 steps cycle through SFT_REPEAT_WORLDS worlds: copying
SFT_REPEAT_WORLDS = 5        # emerges sooner (0 HF, which copies already)
SFT_PRIVILEGED_FRAC = "auto"  # 0.3 embedded, 0 HF: clean demonstrations in the teacher's layout
# RL
RL_STEPS = 60
QUESTIONS_PER_STEP = 8
GROUP_SIZE = 8
LR = "auto"                  # 2e-4 embedded, 1e-6 HF (Search-R1)
KL_COEF = 0.01               # k3 KL to the frozen warm-up model
LORA_RANK = 0                # > 0: RL trains a LoRA adapter of this rank (PEFT); 0: every weight
LORA_ALPHA = 32.0            # the adapter's output is scaled by LORA_ALPHA / LORA_RANK
CLIP_EPS = 0.2
PPO_EPOCHS = 1               # with 1, the ratio is exactly 1 and the clip never acts
GRAD_CLIP = 1.0
MAX_NEW_TOKENS = 48          # per turn
TEMPERATURE = 0.5            # of the rollouts and the teacher's scores (docs/design-notes.md)
# EviSD (evisd.py reads these by name): Â = A + lambda * |A| * m * tanh(tau * gap), the paper's
# defaults. Each row of the paper's ablation table is one constant; the allowed values of the
# string ones are evisd.CHOICES.
EVISD_LAMBDA = 0.2           # the correction's bound as a fraction of |A| (< 1: no sign flip)
EVISD_TAU = 5.0              # the gap's scale inside tanh; the gap is taken at TEMPERATURE, which
                             # doubles its size here (docs/design-notes.md)
EVISD_SPAN = "content"       # m: "content": the query/answer (the paper's) | "action": and the
                             # tags (ours) | "response": every generated token (paper's row -7.1)
EVISD_FORM = "bounded"       # "bounded": modulate A (the paper's) | "gated_loss": plain A plus a
                             # gated distillation loss; with EVISD_SPAN="response" (row -5.8)
EVISD_GATE_COEF = 0.01       # the gated loss's coefficient (ours: SDAR's lambda)
USE_SEARCH_EVIDENCE = True   # search actions read the gold evidence; False: only answer actions
                             # are re-scored and corrected (answer-only privilege, row -2.1)
USE_ANSWER_PRIVILEGE = True  # the answer action reads the golden answer
TEACHER_CONTEXT = "aligned"  # "aligned": each action kind reads only its own block (the paper's)
                             # | "shared": one evidence+answer block for every action (row -0.2)
EVIDENCE_AT = "every"        # ours: "every": a block before each search scored | "first": one
                             # block, before the first search scored (the later ones see it too)
ANSWER_AT = "content"        # ours: the answer block after the opening <answer> | "tag": before
# real data, in the lab (lab/real_data.py, docs/real-data.md): "toy" is the world above
DATA = "toy"                 # "toy" | "hotpotqa" | "2wiki" | "musique" | "jsonl" (Search-R1's)
DATA_TRAIN = ""              # RL questions: hotpot_train_v1.1.json, nq/train.jsonl, ...
DATA_DEV = ""                # what evaluate.py scores: hotpot_dev_distractor_v1.json, ...
CORPUS = ""                  # {"id", "contents"} JSONL, BM25 in memory ("": own paragraphs)
RETRIEVER_URL = ""           # or Search-R1's retrieval server, http://127.0.0.1:8000/retrieve
EVIDENCE = "auto"            # the teacher's on real data: "sentences" (supporting, <= 2 docs x
                             # 2) | "paragraphs" | "answer_passages" | "answer_only" | "auto"
# evaluation and I/O
EVAL_EVERY = 20
EVAL_QUESTIONS = 50          # per held-out split
EVAL_SEED = 1_000_000        # held-out worlds: this seed and up; validation worlds: those below
CKPT_EVERY = 50
OUT_DIR = "out/run"
# system
DEVICE = "auto"              # "auto" (CUDA if there is one) | "cpu" | "cuda" | "cuda:N"
DTYPE = "auto"               # "auto": bf16 on CUDA if it has it | "float32" | "bfloat16" (autocast)
GRADIENT_CHECKPOINTING = False  # recompute activations in backward: memory for real models
DECODE = "generate"          # "generate" (rollout.py) | "static" | "compiled" (lab/fast_decode.py)
MAX_BAD_STEPS = 5            # consecutive non-finite losses before stopping
MEASURE = False              # the lab's per-step measurement (lab/measure.py), for benchmarks

CONFIG_KEYS = [k for k, v in list(globals().items())
               if k.isupper() and isinstance(v, (int, float, bool, str))]
DEFAULTS = {k: globals()[k] for k in CONFIG_KEYS}
# A checkpoint resumed under other values of these would be another experiment spliced onto this
# one, so --resume refuses: the warm-up's settings, the RL recipe's, the data's and EviSD's.
RUN_KEYS = warmup.KEYS + (
    "METHOD", "FRESH_WORLDS", "QUESTIONS_PER_STEP", "GROUP_SIZE", "LR", "KL_COEF", "LORA_RANK",
    "LORA_ALPHA", "CLIP_EPS", "PPO_EPOCHS", "MAX_NEW_TOKENS", "TEMPERATURE", "DATA",
    "DATA_TRAIN", "CORPUS", "EVIDENCE") + tuple(evisd.KNOBS)
# These may change: how long it runs, where and in what precision, how it decodes, evaluates,
# logs and saves. Each constant is in one list, and each read in its own (tests/test_keys.py).
FREE_KEYS = ("RL_STEPS", "OUT_DIR", "SFT_DIR", "DEVICE", "DTYPE", "GRADIENT_CHECKPOINTING",
             "DECODE", "MAX_BAD_STEPS", "MEASURE", "EVAL_EVERY", "EVAL_QUESTIONS", "EVAL_SEED",
             "CKPT_EVERY", "DATA_DEV", "RETRIEVER_URL")
# Which setting another leaves without effect: NAME -> {OTHER: the value of OTHER under which
# NAME goes unread}, named before any work. EviSD's knobs declare theirs in evisd.KNOBS.
UNREAD_WHEN = {"LORA_ALPHA": {"LORA_RANK": 0},
               **dict.fromkeys(("DATA_TRAIN", "DATA_DEV", "CORPUS", "RETRIEVER_URL", "EVIDENCE"),
                               {"DATA": "toy"}),
               **{k: {"SFT_STEPS": 0} for k in warmup.KEYS
                  if k.startswith("SFT_") and k != "SFT_STEPS"}}
# The peers' credit rules (lab/peers.py): the same teacher's gap, credit in their papers' forms.
PEERS = ("rlsd", "opsd", "sdar", "sd_search", "bicaa")


def check_data(cfg):
    """The lab's switch for real data: lab/real_data.py checks its settings and files."""
    if real := evaluate.real_data(cfg):
        real.check_config(cfg)


def unread_settings(cfg):
    """["NAME=value (under OTHER=value)"]: changed settings that another leaves without effect."""
    knobs = {"evisd": evisd.KNOBS, "grpo": dict.fromkeys(evisd.KNOBS, {"METHOD": "grpo"})}
    when = {**UNREAD_WHEN, **knobs.get(cfg["METHOD"], {})}   # a peer reads the knobs its own way
    defaults = dict(DEFAULTS, MODEL=cfg["MODEL"])
    runs.resolve_auto(defaults, SCHEMA)              # "auto" compared as what it became
    unread = {k: next((o for o, v in c.items() if cfg[o] == v), None) for k, c in when.items()}
    return [f"{k}={cfg[k]!r} (under {o}={cfg[o]!r})" for k, o in unread.items()
            if o and cfg[k] != defaults[k]]


SCHEMA = runs.Schema(
    choices={"METHOD": ("evisd", "grpo") + PEERS,
             "DTYPE": ("auto", "float32", "bfloat16", "float16"),    # float16: refused below
             "DECODE": ("generate", "static", "compiled"),
             "DATA": ("toy", "hotpotqa", "2wiki", "musique", "jsonl"),
             "EVIDENCE": ("auto", "sentences", "paragraphs", "answer_passages",
                          "answer_only")},
    # Every number is >= 0; these must be more, before any work starts (EVISD_LAMBDA < 1: at 1,
    # a token's advantage could reach 0 and beyond it flip sign; SEED: what torch takes).
    limits={"SEED": ((lambda v: 0 <= v < 2**63), ">= 0 and < 2^63"), "WORLD_SCALE": above(0),
            "TOP_K": at_least(1), "MAX_TURNS": at_least(1), "SFT_BATCH": at_least(1),
            "SFT_LR": above(0), "SFT_NOISE": fraction(), "SFT_STOP_EARLY": fraction(),
            "SFT_PARTIAL_NAME": fraction(), "SFT_PRIVILEGED_FRAC": fraction(),
            "SFT_REPEAT_WORLDS": at_least(1), "QUESTIONS_PER_STEP": at_least(1),
            "GROUP_SIZE": at_least(2), "LR": above(0), "CLIP_EPS": above(0),
            "PPO_EPOCHS": at_least(1), "GRAD_CLIP": above(0), "MAX_NEW_TOKENS": at_least(1),
            "TEMPERATURE": above(0), "LORA_ALPHA": above(0),
            "EVISD_LAMBDA": ((lambda v: 0 <= v < 1), ">= 0 and < 1"), "EVISD_TAU": above(0),
            "EVAL_QUESTIONS": at_least(1), "EVAL_SEED": at_least(1), "MAX_BAD_STEPS": at_least(1),
            "DTYPE": ((lambda v: v != "float16"), "float32 or bfloat16: float16 would need "
                      "loss scaling, which this project does not do")},
    # "auto": (embedded model, HF model): a pretrained model must never get the tiny one's rates.
    auto={"SFT_LR": (3e-3, 1e-5), "LR": (2e-4, 1e-6), "SFT_PRIVILEGED_FRAC": (0.3, 0.0),
          "SFT_CONTEXT_LOSS": (1.0, 0.0), "SFT_REPEAT_STEPS": (300, 0)},
    checks=(check_data, evisd.check_config))


def configure(argv):
    """(config, resume, overwrite) from the command line, every setting checked (runs.py)."""
    return runs.parse_overrides(argv, DEFAULTS, SCHEMA)


def step_world(cfg, step):
    """The world of an RL step's questions: a toy world (fresh per step), or real data's."""
    if real := evaluate.real_data(cfg):
        return real.dataset(cfg, "train")
    return toy_world.training_world("rl", cfg["SEED"], step if cfg["FRESH_WORLDS"] else 0,
                                    cfg["WORLD_SCALE"])


# ----------------------------------------------------------------------------- one RL step
def rl_step(cfg, step, world, policy, reference, tokenizer, optimizer):
    """One step of GRPO or EviSD on N = QUESTIONS_PER_STEP x GROUP_SIZE episodes of ``world``
    (``reference``: the KL's frozen warm-up model, or None) -> (metrics, record for MEASURE)."""
    t0 = time.perf_counter()
    device, dtype = next(policy.parameters()).device, getattr(torch, cfg["DTYPE"])
    rank, world_size = runs.rank_and_size()

    # 1. Rollout: GROUP_SIZE episodes of each question (under torchrun, this rank's share), one
    #    batch per turn (rollout.py), each episode with its own search env (search_env.py).
    runs.seed_everything("rl", cfg["SEED"], step, rank)   # a resumed run draws the same batch
    questions = random.Random(f"rl-batch/{cfg['SEED']}/{step}").sample(
        world.split("train"), cfg["QUESTIONS_PER_STEP"])[rank::world_size]
    envs = search_env.episodes(world, questions, cfg["GROUP_SIZE"], cfg["MAX_TURNS"], cfg["TOP_K"])
    play = rollout.rollout if cfg["DECODE"] == "generate" else runs.lab(
        "fast_decode", f"DECODE={cfg['DECODE']!r}").decoder(cfg["DECODE"])
    with model.autocast(device, dtype):
        r = play(policy, tokenizer, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"])
    t_rollout = time.perf_counter() - t0
    ids, attention = r.input_ids.to(device), r.attention_mask.to(device)   # [N, T]
    gen_mask = r.gen_mask.to(device)       # [N, T] model-written tokens: the loss mask

    # 2. Reward: each env scored its episode (search_env.outcome_reward: exact match).
    # 3. Group advantage: each reward's z-score within its question's group (grpo.py).
    adv = grpo.group_advantages(r.rewards, cfg["GROUP_SIZE"]).to(device)    # [N]

    def logprobs(lm):   # log p of the batch's tokens under lm, at the sampling temperature
        with model.autocast(device, dtype):
            return model.token_logprobs(lm, ids, attention, gen_mask,
                                        temperature=cfg["TEMPERATURE"])

    # These very weights sampled the batch, so the detached log-probs are the old policy's
    # (PPO's ratio) and the student's (EviSD's gap) at once.
    policy.train()
    logp = logprobs(policy)                                                 # [N, T]
    old_logp = logp.detach()                                                # [N, T]
    with torch.no_grad(), model.without_adapter(reference):   # LoRA: the policy, adapter off
        ref_logp = logprobs(reference) if reference is not None else None   # [N, T]

    # 4. Token advantages. GRPO: every generated token carries its episode's A. EviSD: the same
    #    policy re-scores each action under its own privileged context, and the gap corrects the
    #    A of the actions' content by at most EVISD_LAMBDA |A|, never flipping it (evisd.py).
    t1 = time.perf_counter()
    token_adv, teacher_logp, extra_loss = adv[:, None] * gen_mask, old_logp, None   # [N, T]
    if cfg["METHOD"] != "grpo":
        # EviSD, or a peer's rule from the lab: the same teacher's gap, another form of credit
        credit = evisd.credit if cfg["METHOD"] == "evisd" else runs.lab(
            "peers", f"METHOD={cfg['METHOD']!r}").rule(step)
        with model.autocast(device, dtype):
            token_adv, teacher_logp, extra_loss = credit(policy, tokenizer, world, r, adv,
                                                         old_logp, cfg)     # [N, T] each
    t_teacher = time.perf_counter() - t1 if cfg["METHOD"] != "grpo" else 0.0

    # 5. Loss and 6. optimizer step, PPO_EPOCHS times over the batch (the first reuses logp).
    #    Under torchrun, each rank's loss is a mean over its own tokens: scaled by its share of
    #    all ranks' tokens, the averaged gradient weighs every token alike, as on one process.
    share = runs.token_share(gen_mask) if world_size > 1 else 1.0
    #    From here a stop (Ctrl-C, SIGTERM) waits until the loop has logged this step (runs.py).
    runs.update_begins()
    for epoch in range(cfg["PPO_EPOCHS"]):
        logp = logp if epoch == 0 else logprobs(policy)                     # [N, T]
        loss, stats = grpo.policy_loss(logp, old_logp, ref_logp, token_adv, gen_mask,
                                       cfg["CLIP_EPS"], cfg["KL_COEF"])
        if extra_loss is not None:     # EviSD's gated-loss row, SDAR, SD-Search: a term beside it
            with model.autocast(device, dtype):
                extra = extra_loss(policy, logp)
            loss, stats["extra_loss"] = loss + extra, extra.item()
        loss = loss * share
        finite = torch.isfinite(loss.detach()).float()
        if world_size > 1:   # all ranks skip together, or the gradient all-reduce would hang
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if not finite:
            stats["nonfinite_loss"] = 1
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if world_size > 1:
            runs.all_reduce_gradients(policy)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg["GRAD_CLIP"])
        optimizer.step()

    # The share of generated tokens whose advantage the teacher moved: 0 under GRPO.
    gen_tokens = int(r.gen_mask.sum())
    moved = ((token_adv != adv[:, None]) & gen_mask.bool()).sum().item() / max(gen_tokens, 1)
    metrics = dict(stats, step=step, reward=r.rewards.mean().item(), loss=loss.item(),
                   em=r.em.float().mean().item(), turns=r.turns.float().mean().item(),
                   answered=sum(a is not None for a in r.answers) / len(r.answers),
                   tokens=int(r.attention_mask.sum()), gen_tokens=gen_tokens,
                   modulated_frac=moved, step_s=time.perf_counter() - t0, rollout_s=t_rollout,
                   teacher_s=t_teacher)
    record = dict(rollouts=r, world=world, adv=adv, gap=teacher_logp - old_logp,
                  token_adv=token_adv)
    return metrics, record


# Averaged over ranks under torchrun; the lab's measurements stay rank 0's.
REDUCED = ("reward", "em", "loss", "kl", "clip_frac", "ratio", "turns", "answered", "tokens",
           "gen_tokens", "modulated_frac")


# ----------------------------------------------------------------------------- the run
def build_policy(cfg, device):
    """(policy, tokenizer): the embedded model built offline from the toy world, or an HF model."""
    runs.seed_everything(cfg["SEED"])
    if cfg["MODEL"] in model.SIZES:
        tokenizer = model.build_tokenizer(model.tokenizer_texts())
        policy = model.build_model(tokenizer, cfg["MODEL"], seed=cfg["SEED"],
                                   prev_token_init=cfg["PREV_TOKEN_INIT"])
    else:
        # float32 weights: autocast computes in DTYPE, and an LR of 1e-6 moves a weight by less
        # than bf16's 8 mantissa bits can hold. Weights no step trains (LoRA) load in DTYPE.
        frozen = cfg["LORA_RANK"] and not cfg["SFT_STEPS"]
        policy, tokenizer = model.load_model(cfg["MODEL"], getattr(
            torch, cfg["DTYPE"] if frozen else "float32"))
    if cfg["GRADIENT_CHECKPOINTING"]:
        model.enable_checkpointing(policy)
    return model.without_dropout(policy).to(device), tokenizer


def frozen_reference(policy):
    """The KL term's frozen warm-up model: under LoRA the policy, its adapter off in rl_step; else
    a float32 copy under the same autocast, so the KL at step 0 is exactly 0 in every DTYPE."""
    return policy if model.is_lora(policy) else copy.deepcopy(policy).eval().requires_grad_(False)


def main(argv):
    cfg, resume, overwrite = configure(argv)
    if cfg["LORA_RANK"] and importlib.util.find_spec("peft") is None:
        raise SystemExit("LORA_RANK > 0 trains a LoRA adapter with peft: pip install peft")
    if (unread := unread_settings(cfg)) and os.environ.get("RANK", "0") == "0":
        print(f"note: without effect: {', '.join(unread)}")    # before anything can refuse
    rank, world_size, device, dtype = runs.setup(cfg)
    out = cfg["OUT_DIR"]
    # OUT_DIR and the resume point are settled before the warm-up, so a mistake stops in seconds.
    resumed = runs.open_run(cfg, resume, overwrite, RUN_KEYS, DEFAULTS, SCHEMA, rank)
    if rank == 0:
        print(json.dumps(cfg))

    # 1. The model, 2. the supervised warm-up (cached: the GRPO and EviSD runs of a seed share it).
    policy, tokenizer = build_policy(cfg, device)
    sft_path = warmup.run(cfg, policy, tokenizer, rank)
    # policy holds the warm-up weights now. Under LoRA they freeze, and RL trains an adapter.
    if cfg["LORA_RANK"]:
        policy = model.add_lora(policy, cfg["LORA_RANK"], cfg["LORA_ALPHA"], dtype, sft_path,
                                cfg["SEED"])
    reference = frozen_reference(policy) if cfg["KL_COEF"] > 0 else None

    # 3. RL, resumable.
    trained = [p for p in policy.parameters() if p.requires_grad]   # all, or the adapter's
    optimizer = torch.optim.AdamW(trained, lr=cfg["LR"], weight_decay=0.0)
    start, bad_steps = runs.restore(resumed, policy, optimizer, rank) if resumed else (0, 0)
    del resumed
    checked = runs.start_metrics(out, resume, start, cfg) if rank == 0 else True

    def save(step):
        if rank == 0:
            state = {"optimizer": optimizer.state_dict(), "bad_steps": bad_steps, "config": cfg,
                     "sft_path": sft_path}
            runs.save_checkpoint(out, step, policy, tokenizer, state)

    def quick_check(step):
        em = evaluate.heldout_em(policy, tokenizer, cfg, cfg["EVAL_QUESTIONS"], dtype)
        runs.log_metrics(out, {"step": step, "eval": True,
                               **{f"eval_{k}": v for k, v in em.items()}})
        shown = {"macro": "macro", "hop1": "1-hop", "hop2": "2-hop", "hop3": "3-hop", "f1": "F1"}
        return f"{'warm-up' if step == 0 else f'step {step}'}: held-out EM " + ", ".join(
            f"{label} {em[k]:.2f}" for k, label in shown.items() if em.get(k) is not None)

    def check_due(done, every=cfg["EVAL_EVERY"]):
        return rank == 0 and every and (done % every == 0 or done == cfg["RL_STEPS"])

    done, stopped = start, None   # done: steps whose update the weights hold, what a stop saves
    bar = tqdm(range(start, cfg["RL_STEPS"]), desc=cfg["METHOD"], disable=rank != 0,
               dynamic_ncols=True)
    try:
        if check_due(start) and not checked:   # at 0, or where a stop cut a quick check short
            bar.write(quick_check(start))
        for step in bar:
            # A stop raises during the rollout and waits during the update (runs.one_step).
            with runs.one_step():
                world = step_world(cfg, step)
                metrics, record = rl_step(cfg, step, world, policy, reference, tokenizer,
                                          optimizer)
                if cfg["MEASURE"]:   # the lab's switch: what a benchmark measures beside the step
                    measured = runs.lab("measure", "MEASURE=True").measure(cfg, record)
                    metrics.update({k: v for k, v in measured.items() if k not in metrics})
                if world_size > 1:
                    runs.average_over_ranks(metrics, REDUCED, device)
                bad_steps = bad_steps + 1 if metrics.get("nonfinite_loss") else 0
                if rank == 0:
                    runs.log_metrics(out, metrics)
                    bar.set_postfix(reward=f"{metrics['reward']:.2f}", kl=f"{metrics['kl']:.3f}",
                                    moved=f"{metrics['modulated_frac']:.3f}")
                done = step + 1
            if bad_steps >= cfg["MAX_BAD_STEPS"]:
                raise SystemExit(f"stopping: {bad_steps} consecutive steps had a NaN/inf loss "
                                 "(updates skipped); try a lower LR or DTYPE=float32")
            if check_due(done):
                bar.write(quick_check(done))
            if (cfg["CKPT_EVERY"] and done % cfg["CKPT_EVERY"] == 0) or done == cfg["RL_STEPS"]:
                save(done)
    except (KeyboardInterrupt, search_env.RetrieverError) as e:   # save the steps done, then stop
        stopped = e
        if rank == 0:
            print(f"\ninterrupted: saving step {done} to {out}")
        save(done)
    if cfg["RL_STEPS"] == 0:
        save(0)
    if rank == 0:
        print(f"saved {out}/ckpt-{done:06d} after {done} RL steps; "
              f"evaluate it: python evaluate.py {out}")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if isinstance(stopped, runs.Terminated):
        raise SystemExit(128 + signal.SIGTERM)
    if isinstance(stopped, search_env.RetrieverError):
        raise SystemExit(f"{stopped}; step {done} is saved in {out}: "
                         "--resume continues once the server answers")
    return policy


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, runs.stop_on_sigterm)
    try:
        main(sys.argv[1:])
    except runs.Terminated:  # outside the RL loop (the warm-up, say), which saves on its own
        print("terminated before a checkpoint could be saved", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
    except KeyboardInterrupt:
        raise SystemExit("interrupted before a checkpoint could be saved") from None
