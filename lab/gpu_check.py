"""The GPU check: one command for the next GPU at hand, at most ten minutes, ending in a
one-screen summary that says pass or fail per part with its figures.

    python lab/gpu_check.py out/gpu-check              # on a CUDA machine: the default parts
    python lab/gpu_check.py out/gpu-check --parts train,decode   # rerun what broke (same --work)
    python lab/gpu_check.py out/gpu-check --parts tests,bench,torchrun   # the extra parts
    python lab/gpu_check.py out/gpu-check --dry        # the CPU, tiny sizes (its test)

Default parts, in order, each in its own process(es) under a time box (a part that fails or
runs out of time is recorded with the end of its output, and the next one still runs):

* versions   python, torch, CUDA, transformers, tokenizers, the device and its driver;
* train      train.py on tiny and on small (config/gpu-small.py), cut short, in the device's
             DTYPE: warm-up and RL seconds per step, the KL at step 0 (must be exactly 0: the
             reference computes as the policy does), every loss finite, the full preset's
             time projected;
* decode     the tiny run's model rolls out the same episodes with the core's rollout (HF
             generate) and with lab/fast_decode.py's static decode, same seed: identical
             transcripts in float32 (must), and the share of identical episodes under bf16
             autocast (must be >= 0.9: kernels of different shapes may round a near-tie the
             other way);
* rounding   lab/precision.py on the tiny run's model: bf16 rounding's share of EviSD's
             correction per action kind, on the device (must be <= 0.10, as its CPU test);
* rollout    lab/bench.py --rollout-only: rollout tokens/s of each decode path (the core's
             HF generate, lab/fast_decode.py's static loop; its compiled step on tiny) beside
             plain generate and the roofline, for tiny, small and a random model of
             Qwen2.5-0.5B's shape;
* memory     lab/gpu_memory.py: a random model of Qwen2.5-0.5B-Instruct's exact shape (no
             download) put through two RL updates of the Qwen preset, with
             GRADIENT_CHECKPOINTING, at the worst case docs/one-gpu.md assumes: the peak of
             torch.cuda.max_memory_allocated beside that page's estimate;
* memory-lora the same for Qwen2.5-3B's and Qwen2.5-7B's shapes with a rank-16 LoRA adapter
             (the base frozen in bf16, built in it): the peak, the adapter's parameters, and
             the KL at step 0 (must be exactly 0: the reference is the policy, adapter off).
             Running out of memory, here and in memory, is a measurement, not a failure.

Extra parts (``--parts``): tests (the suite with DEVICE=cuda), bench (the EviSD/GRPO step
ratio), torchrun (two RL steps under ``torchrun --nproc_per_node=1``, NCCL), memory-all (also
0.5B without checkpointing and 1.5B with it).

Results go to OUT/gpu-check.json and OUT/gpu-check.md (rewritten after every part, so a kill
keeps what was done), the summary to the screen and OUT/gpu-check-summary.txt, every process's
output to OUT/gpu-check.log; runs go to a scratch directory (``--work``, a temporary one by
default), where decode and rounding read the train part's tiny run.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# (shape, gradient checkpointing, LoRA rank: 0 trains every weight) of each memory probe
# (lab/gpu_memory.py), and the dry mode's tiny stand-ins.
PROBES = [("qwen2.5-0.5b", True, 0)]
ALL_PROBES = PROBES + [("qwen2.5-0.5b", False, 0), ("qwen2.5-1.5b", True, 0)]
LORA_PROBES = [("qwen2.5-3b", True, 16), ("qwen2.5-7b", True, 16)]
DRY_PROBES = [("tiny", True, 0), ("tiny", False, 0)]
DRY_LORA_PROBES = [("tiny", True, 4)]

# The train part: tiny (the default run's model) and config/gpu-small.py, cut short (the
# small preset's full run is 1,800 + 180 steps). The tiny run's warm-up is long enough for its
# model to write actions, which decode and rounding read.
TRAIN_RUNS = {"tiny": ["--MODEL=tiny", "--SFT_STEPS=300", "--RL_STEPS=4", "--EVAL_EVERY=4",
                       "--EVAL_QUESTIONS=20"],
              "small": ["config/gpu-small.py", "--SFT_STEPS=100", "--RL_STEPS=4",
                        "--EVAL_EVERY=4", "--EVAL_QUESTIONS=20"]}
FULL_SFT_STEPS, FULL_RL_STEPS = 1800, 180
# Dry mode: every part on the CPU at tiny sizes, so the script is known to run before a GPU sees it.
DRY_TRAIN = ["--WORLD_SCALE=0.15", "--SFT_STEPS=4", "--SFT_BATCH=4", "--RL_STEPS=2",
             "--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=2", "--MAX_NEW_TOKENS=12", "--MAX_TURNS=2",
             "--EVAL_QUESTIONS=3", "--EVAL_EVERY=2"]
DRY_RUNS = {"tiny": ["--MODEL=tiny"] + DRY_TRAIN, "small": ["--MODEL=small"] + DRY_TRAIN}
ROUNDING_GUARD = 0.10        # as lab/tests/test_rounding.py
BF16_IDENTICAL = 0.9         # the share of episodes the two decodes must agree on under bf16

# Seconds each part may take, at most; the whole run also stops at --budget, by default their
# sum (600 s, 10 min). memory-lora's random 7B model takes a while to build.
BOXES = {"versions": 30, "train": 150, "decode": 45, "rounding": 45, "rollout": 150,
         "memory": 60, "memory-lora": 120}
EXTRA_BOXES = {"tests": 120, "bench": 75, "torchrun": 60, "memory-all": 150}
PARTS = tuple(BOXES)


# ----------------------------------------------------------------------------- running things
class Check:
    """Where results go, the time left, and how every child process is run."""

    def __init__(self, out, work, dry, budget):
        self.out, self.work, self.dry = out, work, dry
        self.device = "cpu" if dry else "cuda"
        self.deadline = time.monotonic() + budget
        self.box_end = self.deadline
        self.results = {}
        self.log = open(os.path.join(out, "gpu-check.log"), "a")

    def run(self, args, timeout=None, env=None):
        """Run ``args`` (the project's root as working directory), its output to the log, under
        the part's time box (or ``timeout``, if shorter). Returns (returncode or None when it was
        killed for time, output). The child gets its own process group, so a timeout also ends
        whatever it started (torchrun's workers, pytest's children)."""
        left = self.box_end - time.monotonic()
        timeout = left if timeout is None else min(timeout, left)
        self.log.write(f"\n$ {' '.join(args)}   (time box {timeout:.0f} s)\n")
        self.log.flush()
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=max(timeout, 1))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            rc = None
        self.log.write(output)
        self.log.write(f"[exit code {rc if rc is not None else 'none: killed at its time box'}]\n")
        self.log.flush()
        return rc, output

    def python(self, *args, **kw):
        return self.run([sys.executable, *args], **kw)


class PartFailed(Exception):
    """A part that ran but did not give its figures; carries those it did give."""

    def __init__(self, message, figures=None):
        super().__init__(message)
        self.figures = figures or {}


def tail(output, lines=8):
    return "\n".join(output.strip().splitlines()[-lines:])


def expect(rc, output, what, figures=None):
    """Stop the part unless its command ended well, keeping the figures it gave anyway."""
    if rc is None:
        raise PartFailed(f"{what}: stopped at its time box; last output:\n{tail(output)}", figures)
    if rc != 0:
        raise PartFailed(f"{what}: exit code {rc}; last output:\n{tail(output)}", figures)


def run_parts(check, parts, functions):
    """Run each named part under its box; record ok / failed / timed out / skipped with its
    figures and seconds, and rewrite the report after each one."""
    for name in parts:
        started = time.monotonic()
        left = check.deadline - started
        if left < 10:
            check.results[name] = {"status": "skipped", "error": "the check's --budget was spent",
                                   "seconds": 0}
            write_report(check)
            continue
        # The dry mode checks that the script runs, on a CPU that may be busy: boxes 4 times wider.
        box = {**BOXES, **EXTRA_BOXES}[name]
        check.box_end = started + min(box * (4 if check.dry else 1), left)
        try:
            figures, status, error = functions[name](check), "ok", None
        except PartFailed as e:
            figures, error = e.figures, str(e)
            status = "timed out" if "time box" in error else "failed"
        except Exception as e:      # a bug in a part must not stop the parts after it
            figures, status, error = {}, "failed", f"{type(e).__name__}: {e}"
        check.results[name] = {"status": status, "seconds": round(time.monotonic() - started, 1),
                               "figures": figures, **({"error": error} if error else {})}
        print(f"{name}: {status} in {check.results[name]['seconds']} s", flush=True)
        write_report(check)


# ----------------------------------------------------------------------------- the parts
def part_versions(check):
    rc, output = check.python("-c", """
import json, platform, torch, transformers, tokenizers
cuda = torch.cuda.is_available()
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "transformers": transformers.__version__,
                  "tokenizers": tokenizers.__version__,
                  "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                  "capability": (".".join(map(str, torch.cuda.get_device_capability(0)))
                                 if cuda else None),
                  "memory_gib": (round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
                                 if cuda else None),
                  "bf16": torch.cuda.is_bf16_supported() if cuda else None}))
""")
    expect(rc, output, "versions")
    figures = json.loads(output.strip().splitlines()[-1])
    figures["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if not check.dry:
        rc, smi = (check.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             timeout=20)
                   if shutil.which("nvidia-smi") else (1, ""))
        figures["driver"] = smi.strip() if rc == 0 else None
        if figures["device"] == "cpu":
            raise PartFailed("torch sees no CUDA device: run with --dry on a machine without one",
                             figures)
    return figures


def part_tests(check):
    # The dry mode runs one small file: the whole suite would run this very check again.
    targets = (["tests/test_grpo.py"] if check.dry
               else ["tests", "lab/tests", "--ignore=lab/tests/test_gpu_check.py"])
    rc, output = check.python("-m", "pytest", "-q", "-p", "no:cacheprovider", *targets,
                              env={"DEVICE": check.device})
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped)",
                                               tail(output, 3))}
    figures = {"device": check.device, "passed": counts.get("passed", 0),
               "failed": counts.get("failed", 0),
               "errors": counts.get("error", 0) + counts.get("errors", 0),
               "skipped": counts.get("skipped", 0),
               "not_passed": [l.split(" - ")[0] for l in output.splitlines()
                              if l.startswith(("FAILED ", "ERROR "))]}
    expect(rc, output, "pytest", figures)
    return figures


def part_memory(check, probes=PROBES, dry_probes=DRY_PROBES):
    """Each probe in its own process, the part's time left shared among those still to run;
    the KL at step 0 must be exactly 0 (the reference computes as the policy does)."""
    figures, failures = {}, []
    probes = dry_probes if check.dry else probes
    for i, (shape, checkpointing, lora_rank) in enumerate(probes):
        name = (f"{shape}, {'with' if checkpointing else 'without'} checkpointing"
                + (f", LoRA rank {lora_rank}" if lora_rank else ""))
        path = os.path.join(check.work, f"memory-{shape}-{int(checkpointing)}-{lora_rank}.json")
        rc, output = check.python("lab/gpu_memory.py", shape, "--checkpointing",
                                  str(int(checkpointing)), "--lora", str(lora_rank),
                                  "--json", path, *(["--dry"] if check.dry else []),
                                  timeout=(check.box_end - time.monotonic()) / (len(probes) - i))
        if rc == 0 and os.path.exists(path):
            figures[name] = json.load(open(path))
            if figures[name]["kl_step0"] != 0.0:
                failures.append(f"{name}: the KL at step 0 is {figures[name]['kl_step0']}, not 0")
        else:
            oom = "OutOfMemoryError" in output or "out of memory" in output
            figures[name] = {"error": "out of memory" if oom else f"exit code {rc}",
                             "tail": tail(output, 3)}
            if not oom:      # running out of memory is a measurement; anything else is a failure
                failures.append(f"{name}: {tail(output)}")
    if failures:
        raise PartFailed("memory probes failed: " + "; ".join(failures), figures)
    return figures


def part_train(check):
    """tiny, then small: each cut short, in the device's DTYPE; the KL at step 0 must be 0."""
    figures = {}
    for name, args in (DRY_RUNS if check.dry else TRAIN_RUNS).items():
        out, sft = os.path.join(check.work, name), os.path.join(check.work, f"sft-{name}")
        started = time.monotonic()
        rc, output = check.python("train.py", *args, f"--DEVICE={check.device}",
                                  f"--OUT_DIR={out}", f"--SFT_DIR={sft}", "--overwrite")
        figures[name] = {"args": " ".join(args), "wall_s": round(time.monotonic() - started, 1)}
        figures[name].update(train_figures(out, sft, args))
        expect(rc, output, f"train.py ({name})", figures)
        if figures[name].get("kl_step0") != 0.0:
            raise PartFailed(f"{name}: the KL at step 0 is {figures[name].get('kl_step0')}, not "
                             "0: the reference does not compute as the policy does", figures)
    return figures


def train_figures(out, sft, args):
    """Warm-up and RL times and the held-out quick checks of a run, from what it wrote."""
    import statistics
    import torch
    import runs
    figures = {}
    warmups = [d for d in os.listdir(os.path.dirname(sft))
               if d.startswith(os.path.basename(sft) + "-")]
    for d in warmups:
        state = torch.load(os.path.join(os.path.dirname(sft), d, "state.pt"), weights_only=False)
        figures["warmup_s"] = round(state["seconds"], 1)
        figures["warmup_steps"] = state["config"]["SFT_STEPS"]
    rows = runs.read_metrics(out)     # [] before the first row
    steps = [r for r in rows if not r.get("eval")]
    if steps:
        figures["kl_step0"] = steps[0]["kl"]
        figures["dtype"] = json.load(open(os.path.join(out, "config.json")))["DTYPE"]
        # the first step warms CUDA up
        step_s = statistics.median(r["step_s"] for r in steps[1:] or steps)
        figures.update(rl_steps=len(steps), rl_step_s=round(step_s, 3),
                       rl_steps_per_s=round(1 / step_s, 3),
                       rollout_s=round(statistics.median(r["rollout_s"] for r in steps), 3),
                       teacher_s=round(statistics.median(r["teacher_s"] for r in steps), 3))
    evals = [r for r in rows if r.get("eval")]
    if evals:
        figures["heldout_first"] = {k[5:]: v for k, v in evals[0].items()
                                    if k.startswith("eval_")} | {"step": evals[0]["step"]}
        figures["heldout_last"] = {k[5:]: v for k, v in evals[-1].items()
                                   if k.startswith("eval_")} | {"step": evals[-1]["step"]}
    if "warmup_s" in figures and steps:
        figures["projected_full_preset_min"] = round(
            (figures["warmup_s"] / figures["warmup_steps"] * FULL_SFT_STEPS
             + figures["rl_step_s"] * FULL_RL_STEPS) / 60, 1)
    return figures


# The decode part's child: the tiny run's model, the same episodes and seed, played by the core's
# rollout (HF generate) and by lab/fast_decode.py's static decode.
DECODE_CHILD = """
import json, sys, torch
sys.path.insert(0, ".")
import model, rollout, runs, search_env, train
from lab import fast_decode
run, device, path = sys.argv[1:4]
torch.backends.cuda.matmul.allow_tf32 = False       # float32 means float32 here
lm, tok, cfg, _ = runs.load_run(run)
lm = lm.to(device)
world = train.step_world(cfg, 10_000)
questions = world.split("train")[:16]
figures = {}
for dtype in ("float32", "bfloat16"):
    out = []
    for play in (rollout.rollout, fast_decode.decoder("static")):
        torch.manual_seed(0)
        envs = search_env.episodes(world, questions, 2, cfg["MAX_TURNS"], cfg["TOP_K"])
        with model.autocast(torch.device(device), getattr(torch, dtype)):
            out.append(play(lm, tok, envs, cfg["MAX_NEW_TOKENS"], cfg["TEMPERATURE"]))
    a, b = out
    same = [ta == tb for ta, tb in zip(a.turn_texts, b.turn_texts)]
    actions = sum(s.kind != "invalid" for spans in a.spans for s in spans)
    figures[dtype] = {"episodes": len(same), "identical": sum(same),
                      "identical_share": sum(same) / len(same), "actions": actions}
json.dump(figures, open(path, "w"))
print(json.dumps(figures))
"""


def tiny_run(check):
    """The train part's tiny run, which decode and rounding read."""
    run = os.path.join(check.work, "tiny")
    if not os.path.isdir(run) or not any(d.startswith("ckpt-") for d in os.listdir(run)):
        raise PartFailed(f"needs the train part's tiny run in {run}: run the train part first "
                         "(with the same --work)")
    return run


def part_decode(check):
    path = os.path.join(check.work, "decode.json")
    rc, output = check.python("-c", DECODE_CHILD, tiny_run(check), check.device, path)
    expect(rc, output, "the decode identity")
    figures = json.load(open(path))
    if figures["float32"]["identical_share"] < 1.0:
        raise PartFailed("float32: the core's rollout and the static decode sampled different "
                         "episodes", figures)
    if figures["bfloat16"]["identical_share"] < BF16_IDENTICAL:
        raise PartFailed(f"bf16: fewer than {BF16_IDENTICAL:.0%} of the episodes identical",
                         figures)
    return figures


def part_rounding(check):
    path = os.path.join(check.work, "rounding.json")
    rc, output = check.python("lab/precision.py", tiny_run(check), "--device", check.device,
                              "--experts", "--json", path)
    expect(rc, output, "lab/precision.py")
    figures = {kind: {k: round(v, 4) if isinstance(v, float) else v for k, v in f.items()}
               for kind, f in json.load(open(path)).items()}
    # The dry run's model has had 4 warm-up steps: its gaps say nothing about a trained one's.
    over = [kind for kind, f in figures.items()
            if f.get("share", 0) > ROUNDING_GUARD and not check.dry]
    if over or not all(f.get("tokens") for f in figures.values()):
        raise PartFailed(f"rounding's share above {ROUNDING_GUARD} (or no tokens) for "
                         f"{', '.join(over) or 'some kind'}", figures)
    return figures


def part_bench(check):
    path = os.path.join(check.work, "bench.json")
    extra = ["--sizes", "tiny", "--repeats", "1", "--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=2",
             "--MAX_NEW_TOKENS=12"] if check.dry else ["--repeats", "2"]
    rc, output = check.python("lab/bench.py", "--device", check.device, "--json", path, *extra)
    expect(rc, output, "bench.py")
    result = json.load(open(path))
    keep = ("params", "episodes", "gen_tokens", "rollout_tok_s", "generate_tok_s", "rollout_s",
            "teacher_s", "grpo_step_s", "evisd_step_s", "peak")
    return {"evisd_step_over_grpo_step": round(result["evisd_step_over_grpo_step"], 3),
            "rollout_static_over_generate": round(result["rollout_static_over_generate"], 3),
            **{row["config"]: {k: round(row[k], 3) if isinstance(row[k], float) else row[k]
                               for k in keep}
               for row in result["rows"]}}


def part_torchrun(check):
    out = os.path.join(check.work, "ddp")
    args = DRY_TRAIN if check.dry else ["--SFT_STEPS=20", "--QUESTIONS_PER_STEP=4"]
    rc, output = check.python("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                              "train.py", *args, "--RL_STEPS=2", "--EVAL_EVERY=0",
                              f"--DEVICE={check.device}", f"--OUT_DIR={out}",
                              f"--SFT_DIR={os.path.join(check.work, 'ddp-warmup')}", "--overwrite")
    backend = re.search(r"DDP: (\d+) processes, backend (\w+)", output)
    figures = {"processes": int(backend.group(1)) if backend else None,
               "backend": backend.group(2) if backend else None}
    expect(rc, output, "torchrun train.py", figures)
    import runs
    figures["rows"] = len(runs.read_metrics(out))
    figures["checkpoint"] = os.path.isdir(os.path.join(out, "ckpt-000002"))
    if figures["rows"] != 2 or not figures["checkpoint"]:
        raise PartFailed("torchrun train.py: expected 2 metric rows and ckpt-000002", figures)
    return figures


def part_rollout(check):
    """The rollout table: one bench process for the eager paths, one for the compiled step."""
    if check.dry:      # the CPU: tiny sizes, and no compiled step (minutes of C++ compiling)
        common = ["--sizes", "tiny", "--shapes", "tiny", "--repeats", "1",
                  "--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=2", "--MAX_NEW_TOKENS=12"]
        groups = {"eager": "static,generate"}
    else:
        common = ["--repeats", "1"]
        groups = {"eager": "static,generate", "compiled": "compiled,static"}
    sizes = {"eager": ["--sizes", "tiny,small", "--shapes", "qwen2.5-0.5b"],
             "compiled": ["--sizes", "tiny"]}      # the compiled step: its compile takes the time
    figures, failures = {}, []
    for name, decodes in groups.items():
        path = os.path.join(check.work, f"rollout-{name}.json")
        rc, output = check.python("lab/bench.py", "--device", check.device, "--rollout-only",
                                  "--decodes", decodes, "--json", path,
                                  *(common if check.dry else sizes[name] + common))
        if rc != 0:
            failures.append(f"{name}: {'time box' if rc is None else f'exit code {rc}'}: "
                            f"{tail(output)}")
            continue
        result = json.load(open(path))
        figures["copy_bandwidth_gb_s"] = round(result["copy_bandwidth_gb_s"], 1)
        for row in result["rows"]:
            figures.setdefault(row["config"], {}).update(
                {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()
                 if k.startswith(("rollout_", "generate_", "roofline")) or k == "params"})
    if failures:
        raise PartFailed("bench.py --rollout-only: " + "; ".join(failures), figures)
    return figures


FUNCTIONS = {"versions": part_versions, "train": part_train, "decode": part_decode,
             "rounding": part_rounding, "rollout": part_rollout, "memory": part_memory,
             "tests": part_tests, "bench": part_bench, "torchrun": part_torchrun,
             "memory-lora": lambda check: part_memory(check, LORA_PROBES, DRY_LORA_PROBES),
             "memory-all": lambda check: part_memory(check, ALL_PROBES)}


# ----------------------------------------------------------------------------- the report
def flat(figures, prefix=""):
    """Nested figures as (name, value) rows."""
    for k, v in figures.items():
        if isinstance(v, dict):
            yield from flat(v, f"{prefix}{k}: ")
        else:
            yield f"{prefix}{k}", v


def headline(name, f, dry=False):
    """One line of a part's figures for the summary."""
    def num(v, spec=",.0f"):
        return "–" if v is None else format(v, spec)
    if name == "versions":
        return (f"{f.get('device')}, torch {f.get('torch')}, CUDA {f.get('cuda')}, "
                f"transformers {f.get('transformers')}, bf16 {f.get('bf16')}")
    if name == "train":
        return "; ".join(f"{n} ({v.get('dtype')}): warm-up {v.get('warmup_s')} s, RL "
                         f"{v.get('rl_step_s')} s/step, KL at step 0 {v.get('kl_step0')}"
                         for n, v in f.items() if isinstance(v, dict))
    if name == "decode":
        return "; ".join(f"{d}: {v['identical']} of {v['episodes']} episodes identical"
                         for d, v in f.items())
    if name == "rounding":
        return "; ".join(f"{k}: {v.get('share')} of the correction over {v.get('tokens')} "
                         f"tokens" for k, v in f.items()) + f" (guard {ROUNDING_GUARD}" + (
                             ", not applied to the dry run's untrained model)" if dry else ")")
    if name == "rollout":
        cells = []
        for config, row in f.items():
            if not isinstance(row, dict):
                continue
            paths = [d for d in ("generate", "static", "compiled") if f"rollout_{d}_tok_s" in row]
            cells.append(f"{config} " + " / ".join(
                f"{d} {num(row[f'rollout_{d}_tok_s'])} "
                f"({num(row.get(f'rollout_{d}_of_roofline'), '.0%')})" for d in paths))
        return "tok/s (of roofline): " + "; ".join(cells)
    if name.startswith("memory"):
        return "; ".join(f"{probe}: peak {v.get('peak_gb', v.get('peak_rss_gb', v.get('error')))}"
                         " GB" for probe, v in f.items())
    return ", ".join(f"{k} {v}" for k, v in flat(f))[:160]


def summary(check):
    """The one-screen summary: PASS or FAIL per part, its seconds and its headline figures."""
    lines = [f"GPU check{' (dry: CPU, tiny sizes)' if check.dry else ''}, "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"]
    for name, r in check.results.items():
        verdict = "PASS" if r["status"] == "ok" else "FAIL" if r["status"] != "skipped" else "SKIP"
        lines.append(f"{verdict:4} {name:<11} {r['seconds']:>6.1f} s  "
                     + headline(name, r.get("figures") or {}, check.dry))
        if r.get("error"):
            lines.append(" " * 5 + r["error"].splitlines()[0][:150])
    total = sum(r["seconds"] for r in check.results.values())
    bad = [n for n, r in check.results.items() if r["status"] != "ok"]
    lines.append(f"{'all parts pass' if not bad else 'not ok: ' + ', '.join(bad)}; "
                 f"{total:.0f} s of parts")
    return "\n".join(lines)


def write_report(check):
    """gpu-check.json and gpu-check.md, written under temporary names and renamed into place."""
    report = {"dry": check.dry, "parts": check.results}
    lines = ["# GPU check" + (" (dry mode: CPU, tiny sizes)" if check.dry else ""), "",
             "| part | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {r['status']} | {r['seconds']} |" for name, r in check.results.items()]
    for name, r in check.results.items():
        lines += ["", f"## {name}", ""]
        if r.get("error"):
            lines += ["```", r["error"], "```", ""]
        if r.get("figures"):
            lines += ["| figure | value |", "|---|---|"]
            lines += [f"| {k} | {json.dumps(v) if not isinstance(v, str) else v} |"
                      for k, v in flat(r["figures"])]
    for path, text in (("gpu-check.json", json.dumps(report, indent=1)),
                       ("gpu-check.md", "\n".join(lines) + "\n")):
        full = os.path.join(check.out, path)
        with open(full + ".tmp", "w") as f:
            f.write(text)
        os.replace(full + ".tmp", full)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true",
                    help="CPU and tiny sizes: check the script itself")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma-separated, from {','.join(FUNCTIONS)} (default: "
                         f"{','.join(PARTS)})")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole check, parts after it are skipped "
                    f"(default {sum(BOXES.values())}: the parts' boxes; dry mode 4 times that)")
    ap.add_argument("--work", default=None,
                    help="scratch directory for runs (default: a temporary one)")
    ap.add_argument("out", help="directory for gpu-check.json, gpu-check.md and gpu-check.log")
    args = ap.parse_args(argv)
    parts = args.parts.split(",")
    unknown = [p for p in parts if p not in FUNCTIONS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; the parts are {', '.join(FUNCTIONS)}")
    os.makedirs(args.out, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="gpu-check-")
    os.makedirs(work, exist_ok=True)
    budget = args.budget or sum(BOXES.values()) * (4 if args.dry else 1)
    check = Check(os.path.abspath(args.out), os.path.abspath(work), args.dry, budget)
    previous = os.path.join(check.out, "gpu-check.json")
    if os.path.exists(previous):     # a rerun of some parts keeps the others' results
        check.results = {k: v for k, v in json.load(open(previous))["parts"].items()
                         if k not in parts}
    run_parts(check, parts, FUNCTIONS)
    bad = [name for name in parts if check.results[name]["status"] != "ok"]
    text = summary(check)
    with open(os.path.join(check.out, "gpu-check-summary.txt"), "w") as f:
        f.write(text + "\n")
    print("\n" + text + f"\nfigures: {os.path.join(check.out, 'gpu-check.md')}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
