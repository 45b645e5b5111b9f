"""Run plumbing, so that train.py can be the loop: the checked config, processes, device and seeds,
checkpoints (an HF directory with ``state.pt`` beside it, the last two kept), resume checks, the
metrics log, and ``lab``, the one way the core reaches the lab folder."""
import ast
import contextlib
import hashlib
import importlib
import json
import os
import random
import re
import shutil
import signal
import sys
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

import model


# ----------------------------------------------------------------------------- the config
def at_least(low):
    return (lambda v: v >= low), f">= {low}"


def above(low):
    return (lambda v: v > low), f"> {low}"


def fraction():
    return (lambda v: 0 <= v <= 1), "from 0 to 1"


@dataclass
class Schema:
    """Beyond the defaults' types: ``choices``, ``limits`` (name -> (test, what is allowed), once
    "auto" is resolved), ``auto`` (name -> (embedded, HF value)), ``checks`` (stop on clashes)."""
    choices: dict = field(default_factory=dict)
    limits: dict = field(default_factory=dict)
    auto: dict = field(default_factory=dict)
    checks: tuple = ()


def check_setting(name, value, text, defaults, schema, where=""):
    """``value`` if its type is the default's (an int will do for a float), else stop saying why."""
    if name not in defaults:
        raise SystemExit(f"{where}unknown setting {name!r}; allowed: {', '.join(sorted(defaults))}")
    if name in schema.auto and value == "auto":    # else a number of its auto values' type
        return value
    default = schema.auto[name][0] if name in schema.auto else defaults[name]
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not type(default):
        like = f"{default!r} or \"auto\"" if name in schema.auto else f"the default {default!r}"
        raise SystemExit(f"{where}{name}={text!r}: expected {type(default).__name__} "
                         f"like {like}, got {type(value).__name__}")
    if name in schema.choices and value not in schema.choices[name]:
        raise SystemExit(f"{where}{name}={value!r}: allowed values are "
                         f"{', '.join(schema.choices[name])}")
    return value


def read_config_file(path, defaults, schema):
    """(name, value) of each ``NAME = literal`` line of a preset file: parsed, never executed."""
    if not os.path.isfile(path):
        raise SystemExit(f"no config file {path!r}; the presets are config/*.py")
    source = open(path).read()
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        raise SystemExit(f"{path}, line {e.lineno}: not a valid config file: {e.msg}") from None
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
        yield name, check_setting(name, value, text, defaults, schema, where)


def parse_overrides(argv, defaults, schema):
    """(config, resume, overwrite): files and overrides in order, "auto" resolved, all checked."""
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
            config[name] = check_setting(name, value, text, defaults, schema)
        elif arg.endswith(".py"):
            config.update(read_config_file(arg, defaults, schema))
        else:
            raise SystemExit(f"bad argument {arg!r}: use --NAME=value, a config file "
                             "(config/NAME.py), --resume or --overwrite")
    if flags == {"resume", "overwrite"}:
        raise SystemExit("--resume continues the run in OUT_DIR and --overwrite deletes it: "
                         "give one")
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", config["DEVICE"]):
        raise SystemExit(f"DEVICE={config['DEVICE']!r}: allowed values are auto, cpu, cuda, cuda:N")
    resolve_auto(config, schema)
    # Every number is >= 0 unless schema.limits says more.
    limits = {name: at_least(0) for name, value in config.items()
              if isinstance(value, (int, float)) and not isinstance(value, bool)}
    for name, (test, allowed) in {**limits, **schema.limits}.items():
        if not test(config[name]):
            raise SystemExit(f"{name}={config[name]!r}: allowed values are {allowed}"
                             + (" (or auto)" if name in schema.auto else ""))
    path = config["MODEL"]
    if (path not in model.SIZES and os.path.isdir(path)
            and not os.path.exists(os.path.join(path, "config.json"))):
        raise SystemExit(f"MODEL={path!r}: this directory has no config.json, so it is not a "
                         f"Hugging Face model directory; embedded models: {', '.join(model.SIZES)}")
    for check in schema.checks:        # last: a check may read files (real_data.check_config)
        check(config)
    return config, "resume" in flags, "overwrite" in flags


def resolve_auto(config, schema):
    """Every "auto" made concrete, here and nowhere else: schema.auto's by model, DEVICE, DTYPE."""
    embedded = config["MODEL"] in model.SIZES
    for name, (for_embedded, for_hf) in schema.auto.items():
        if config[name] == "auto":
            config[name] = for_embedded if embedded else for_hf
    if config["DEVICE"] == "auto":
        config["DEVICE"] = "cuda" if torch.cuda.is_available() else "cpu"
    if config["DTYPE"] == "auto":
        bf16 = config["DEVICE"].startswith("cuda") and torch.cuda.is_bf16_supported()
        config["DTYPE"] = "bfloat16" if bf16 else "float32"


def lab(module, feature):
    """``lab.<module>`` for ``feature``; without the lab folder, a line saying what it needs."""
    try:
        return importlib.import_module(f"lab.{module}")
    except ModuleNotFoundError as e:
        if e.name not in ("lab", f"lab.{module}"):
            raise
        raise SystemExit(f"{feature} needs lab/{module}.py, the lab folder, which this checkout "
                         "does not have") from None


# ------------------------------------------------------------------------- processes, device, seeds
def setup(cfg):
    """(rank, world_size, device, dtype); under torchrun, a rank of a data-parallel group."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group("nccl" if cfg["DEVICE"].startswith("cuda") else "gloo")
    rank, world_size = rank_and_size()
    if cfg["QUESTIONS_PER_STEP"] % world_size:
        raise SystemExit(f"QUESTIONS_PER_STEP={cfg['QUESTIONS_PER_STEP']} must divide by the "
                         f"{world_size} processes")
    if dist.is_initialized() and rank == 0:
        print(f"DDP: {world_size} processes, backend {dist.get_backend()}")
    # The cores are split between the ranks; OMP_NUM_THREADS, when set, wins.
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0))
                          or max(1, (os.cpu_count() or 1) // world_size))
    return (rank, world_size, *pick_device(cfg))


def rank_and_size():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def average_over_ranks(metrics, keys, device):
    """Replace ``metrics[k]`` for each of ``keys`` it has by its mean over the ranks, in place."""
    keys = [k for k in keys if k in metrics]
    vals = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(vals)
    metrics.update({k: v / dist.get_world_size() for k, v in zip(keys, vals.tolist())})


def pick_device(cfg):
    """(device, compute dtype) from DEVICE and DTYPE; under torchrun each rank takes its GPU."""
    device = cfg["DEVICE"]
    if device.startswith("cuda") and dist.is_initialized():
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return torch.device(device), getattr(torch, cfg["DTYPE"])


def token_share(mask):
    """This rank's masked tokens over the mean count of all ranks': a loss that is a mean over
    this rank's tokens, times this share and averaged over the ranks, is the mean over all."""
    mine = mask.sum().float()
    total = mine.clone()
    dist.all_reduce(total)
    return mine * dist.get_world_size() / total.clamp(min=1.0)


def all_reduce_gradients(policy):
    """Average the gradients over the ranks, as DDP does: every rank takes the same step."""
    for p in policy.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def seed_everything(*parts):
    """Seed every RNG from SEED, or from several parts (SEED, step, rank) hashed to 63 bits:
    unlike SEED * 1_000_003 + step, no overflow however large SEED is."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    seed = parts[0] if len(parts) == 1 else int.from_bytes(digest[:8], "big") >> 1
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------- checkpoints
def atomic_save(path, policy, tokenizer, state):
    """Write a checkpoint directory under a temporary name, then rename it into place."""
    tmp, old = path + ".tmp", path + ".old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_checkpoint_dir(policy, tokenizer, tmp)
    torch.save(state, os.path.join(tmp, "state.pt"))
    if os.path.exists(path):
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def checkpoints(out_dir):
    """A run's ``ckpt-NNNNNN`` directories, oldest first (not an interrupted save's .tmp, .old)."""
    names = ([n for n in os.listdir(out_dir) if re.fullmatch(r"ckpt-\d+", n)]
             if os.path.isdir(out_dir) else [])
    return [os.path.join(out_dir, n) for n in sorted(names, key=lambda n: int(n[5:]))]


def save_checkpoint(out_dir, step, policy, tokenizer, state):
    """``ckpt-<step>`` with ``state`` (no RNG states: every RL step seeds its own); the newest two
    are kept, one to fall back on if the other is damaged, and older ones and leftovers go."""
    atomic_save(os.path.join(out_dir, f"ckpt-{step:06d}"), policy, tokenizer,
                dict(state, step=step))
    kept = checkpoints(out_dir)[-2:]
    for name in os.listdir(out_dir):
        if name.startswith("ckpt-") and os.path.join(out_dir, name) not in kept:
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)


def restore(resumed, policy, optimizer, rank):
    """Put load_checkpoint's weights and optimizer state in place: (start step, bad steps)."""
    ckpt, weights, _, state = resumed
    model.put_weights(policy, weights)
    optimizer.load_state_dict(state["optimizer"])
    if rank == 0:
        print(f"resumed from {ckpt} at step {state['step']}")
    return state["step"], state["bad_steps"]


def load_checkpoint(out_dir, read=lambda path: model.load_model(path, local_files_only=True)):
    """(path, *read(path): its model and tokenizer, or --resume's model.read_weights, training
    state) of the newest readable checkpoint, or None; a damaged one named, the one before read."""
    for path in reversed(checkpoints(out_dir)):
        try:
            loaded = read(path)
            state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
            if missing := sorted({"step", "bad_steps", "optimizer", "config"} - set(state)):
                raise KeyError(f"state.pt has no {', '.join(missing)}")
            return path, *loaded, state
        except Exception as e:      # damage fails in many ways (OSError, zip, pickle, safetensors)
            why = (str(e).strip().splitlines() or [""])[0]
            print(f"warning: checkpoint {path} is unreadable ({type(e).__name__}: {why}); "
                  "trying an older one", file=sys.stderr)
    return None


def load_run(run_dir):
    """(model, tokenizer, config, warm-up path) of a run's newest checkpoint, or of a checkpoint."""
    if os.path.exists(os.path.join(run_dir, "state.pt")):
        policy, tok = model.load_model(run_dir, local_files_only=True)
        state = torch.load(os.path.join(run_dir, "state.pt"), weights_only=False)
    elif found := load_checkpoint(run_dir):
        _, policy, tok, state = found
    else:
        raise SystemExit(f"{run_dir}: no readable checkpoint (ckpt-*) found; has it trained?")
    return policy.eval(), tok, state["config"], state.get("sft_path")


# ----------------------------------------------------------------------------- the run directory
class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, a preemptible machine): saved as on Ctrl-C, exit status 128 + 15."""


def stop_on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the save short
    raise Terminated


_step = None   # inside one_step: the stops' own handlers once its update began, the stops held


@contextlib.contextmanager
def one_step():
    """One RL step's block in train.main: a stop (Ctrl-C, SIGTERM) raises at once until rl_step
    calls ``update_begins``, then waits for the block's end: no save holds an update twice."""
    global _step
    _step = step = {"handlers": {}, "held": []}
    try:
        yield
    finally:
        _step = None
        for signum, handler in step["handlers"].items():
            signal.signal(signum, handler)
    for signum in step["held"]:    # the block ended whole: now the stop acts
        signal.raise_signal(signum)


def update_begins():
    """From here to the end of ``one_step``'s block, Ctrl-C and SIGTERM wait (rl_step's call)."""
    step = _step      # signal handlers can be set in the main thread only
    if step is None or step["handlers"] or threading.current_thread() != threading.main_thread():
        return
    step["handlers"] = {s: signal.signal(s, lambda signum, _: step["held"].append(signum))
                        for s in (signal.SIGINT, signal.SIGTERM)}


def open_run(cfg, resume, overwrite, run_keys, defaults, schema, rank):
    """Make OUT_DIR ready: a fresh run stops before writing over another (--overwrite deletes it);
    --resume reads the newest checkpoint (or None) and stops if it is another run."""
    out = cfg["OUT_DIR"]
    held = [] if resume else [os.path.basename(c) for c in checkpoints(out)]
    rows = [] if resume else read_metrics(out)
    held += [f"metrics.jsonl with {len(rows)} rows"] if rows else []
    if held and not overwrite:
        raise SystemExit(f"{out} already holds a run ({', '.join(held)}). Continue it with "
                         "--resume, give another --OUT_DIR, or --overwrite to delete it.")
    if held and rank == 0:
        print(f"--overwrite: deleting {', '.join(held)} in {out}")
        for name in os.listdir(out):
            if name.startswith("ckpt-"):
                shutil.rmtree(os.path.join(out, name))
        if rows:
            os.remove(os.path.join(out, "metrics.jsonl"))
    resumed = load_checkpoint(out, model.read_weights) if resume else None
    if resumed:
        saved = {**defaults, **resumed[3]["config"]}   # a setting it lacks reads as the default,
        resolve_auto(saved, schema)                    # "auto" made concrete as the run's was
        diff = {k: f"{k}={cfg[k]!r} (checkpoint: {saved.get(k)!r})" for k in cfg
                if k != "OUT_DIR" and saved.get(k) != cfg[k]}   # a moved run is the same run
        if defining := [v for k, v in diff.items() if k in run_keys]:
            raise SystemExit(f"--resume: {resumed[0]} is another run: {', '.join(defining)}. "
                             "Resume with the checkpoint's values, or give another OUT_DIR.")
        if diff and rank == 0:
            print(f"--resume: continuing {resumed[0]} with changed settings: "
                  f"{', '.join(diff.values())}")
        c, want = resumed[2], model.SIZES.get(cfg["MODEL"])   # SIZES change with the code
        if c and want and want != (c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                                   c.num_key_value_heads, c.intermediate_size):
            raise SystemExit(f"--resume: {resumed[0]} holds a {cfg['MODEL']} model of another "
                             f"shape than today's model.SIZES {want}: give another OUT_DIR, or "
                             "resume with the code that wrote it.")
    elif resume and rank == 0:
        print(f"--resume: no readable checkpoint in {out}; starting again from the warm-up")
    os.makedirs(out, exist_ok=True)
    return resumed


# ----------------------------------------------------------------------------- the metrics log
def read_metrics(run_dir):
    """The rows of a run's metrics.jsonl; a line not a row (a write cut short) is dropped."""
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


def start_metrics(run_dir, resume, start, cfg):
    """config.json, and metrics.jsonl written atomically: empty, or on --resume from ``start`` the
    rows the loop will not log again (steps before ``start``; its quick check unless it is 0).
    Returns whether that quick check is kept (a stop during it leaves none)."""
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    path = os.path.join(run_dir, "metrics.jsonl")
    kept = [r for r in (read_metrics(run_dir) if resume else [])
            if r["step"] < start or (r["step"] == start > 0 and r.get("eval"))]
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    os.replace(path + ".tmp", path)
    return any(r["step"] == start and r.get("eval") for r in kept)


def log_metrics(run_dir, row):
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")
