"""Faults and bad input, one test per row of the README's table: torn logs, reused run
directories, changed settings on resume, damaged checkpoints and save leftovers, SIGTERM, and
model output that is not valid Unicode."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

import evaluate
import model
import runs
import train
from test_train import TINY, rows, strip_timing

BASE = TINY + ["--RL_STEPS=2", "--CKPT_EVERY=1", "--EVAL_EVERY=0"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-step run (checkpoints after steps 1 and 2) and its cached warm-up."""
    root = tmp_path_factory.mktemp("faults")
    train.main(BASE + [f"--OUT_DIR={root}/run", f"--SFT_DIR={root}/sft"])
    return root


@pytest.fixture
def run_copy(finished, tmp_path):
    """A copy of the finished run to damage, and the train.py arguments that point at it."""
    out = str(tmp_path / "run")
    shutil.copytree(finished / "run", out)
    return out, BASE + [f"--OUT_DIR={out}", f"--SFT_DIR={finished}/sft"]


def ckpt_names(out):
    return sorted(n for n in os.listdir(out) if n.startswith("ckpt-"))


def test_unreadable_metrics_lines_are_dropped_with_a_warning(run_copy, capsys):
    out, args = run_copy
    before = rows(out)
    log = os.path.join(out, "metrics.jsonl")
    lines = open(log).readlines()
    with open(log, "w") as f:   # a stray line in the middle, and a last line cut mid-write
        f.writelines([lines[0], "not json\n", lines[1], lines[1][:25]])
    assert runs.read_metrics(out) == before
    assert "dropped 2 unreadable line(s), the first is line 2" in capsys.readouterr().err
    train.main(args + ["--resume"])     # nothing left to train: it reads and rewrites the log
    assert rows(out) == before


def test_leftovers_of_interrupted_saves_never_count_and_are_removed(run_copy, capsys):
    out, args = run_copy
    # A complete-looking later step under a .tmp name, and an .old of step 1.
    shutil.copytree(os.path.join(out, "ckpt-000002"), os.path.join(out, "ckpt-000060.tmp"))
    shutil.copytree(os.path.join(out, "ckpt-000001"), os.path.join(out, "ckpt-000001.old"))
    train.main(args + ["--resume", "--RL_STEPS=3"])
    assert f"resumed from {out}/ckpt-000002 at step 2" in capsys.readouterr().out
    assert ckpt_names(out) == ["ckpt-000002", "ckpt-000003"]   # the save just made survives
    assert [r["step"] for r in rows(out)] == [0, 1, 2]


def test_unreadable_latest_checkpoint_falls_back_to_the_one_before(run_copy, capsys):
    out, args = run_copy
    before = rows(out)
    os.remove(os.path.join(out, "ckpt-000002", "model.safetensors"))
    train.main(args + ["--resume"])
    captured = capsys.readouterr()
    assert f"checkpoint {out}/ckpt-000002 is unreadable (OSError" in captured.err
    assert f"resumed from {out}/ckpt-000001 at step 1" in captured.out
    assert strip_timing(rows(out)) == strip_timing(before)   # step 1 again, the same metrics
    assert runs.load_checkpoint(out)[0] == os.path.join(out, "ckpt-000002")   # rewritten whole


@pytest.mark.parametrize("damage", ["weights gone", "weights garbled", "state.pt cut short",
                                    "state.pt gone", "state.pt without the optimizer"])
def test_every_kind_of_damage_makes_a_checkpoint_unreadable(run_copy, capsys, damage):
    out, _ = run_copy
    ckpt = os.path.join(out, "ckpt-000002")
    weights, state = os.path.join(ckpt, "model.safetensors"), os.path.join(ckpt, "state.pt")
    if damage == "weights gone":
        os.remove(weights)
    elif damage == "weights garbled":
        open(weights, "wb").write(b"\x00garbage" * 100)
    elif damage == "state.pt cut short":
        data = open(state, "rb").read()
        open(state, "wb").write(data[:len(data) // 2])
    elif damage == "state.pt gone":
        os.remove(state)
    else:
        s = train.torch.load(state, weights_only=False)
        del s["optimizer"]
        train.torch.save(s, state)
    path, _, _, loaded = runs.load_checkpoint(out)
    assert path == os.path.join(out, "ckpt-000001") and loaded["step"] == 1
    assert f"checkpoint {ckpt} is unreadable" in capsys.readouterr().err


def test_damaged_cached_warmup_stops_with_its_path(finished, tmp_path):
    (name,) = [d for d in os.listdir(finished) if d.startswith("sft-")]
    shutil.copytree(finished / name, tmp_path / name)
    os.remove(tmp_path / name / "model.safetensors")
    with pytest.raises(SystemExit,
                       match=re.escape(f"the cached warm-up {tmp_path / name} is unreadable")
                       + ".*delete that directory and the warm-up is trained again"):
        train.main(BASE + [f"--OUT_DIR={tmp_path}/run", f"--SFT_DIR={tmp_path}/sft"])


def test_reused_out_dir_stops_unless_told_to_overwrite(run_copy):
    out, args = run_copy
    before = rows(out)
    with pytest.raises(SystemExit,
                       match=r"already holds a run \(ckpt-000001, ckpt-000002, "
                             r"metrics.jsonl with 2 rows\)\. Continue it with --resume"):
        train.main(args)
    assert rows(out) == before and ckpt_names(out) == ["ckpt-000001", "ckpt-000002"]
    train.main(args + ["--overwrite", "--RL_STEPS=0"])
    assert rows(out) == [] and ckpt_names(out) == ["ckpt-000000"]


def test_resume_without_a_readable_checkpoint_starts_a_clean_log(run_copy, capsys):
    out, args = run_copy
    before = rows(out)
    for name in ckpt_names(out):
        shutil.rmtree(os.path.join(out, name))
    # The earlier attempt's step-0 quick check must not stay either: the restart logs its own.
    before = [{"step": 0, "eval": True}] + before
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in before)
    train.main(args + ["--resume", "--RL_STEPS=1"])
    assert "no readable checkpoint" in capsys.readouterr().out
    # The run starts again at step 0: its log holds that run's rows once, none of the earlier
    # attempt's.
    assert [r["step"] for r in rows(out)] == [0]
    assert len(before) > 1


def test_resume_with_other_settings_names_them(run_copy, capsys):
    out, args = run_copy
    with pytest.raises(SystemExit) as stop:
        train.main(args + ["--resume", "--SEED=1", "--METHOD=grpo", "--RL_STEPS=5"])
    message = str(stop.value)
    assert "is another run: METHOD='grpo' (checkpoint: 'evisd'), SEED=1 (checkpoint: 0)" in message
    assert "RL_STEPS" not in message
    # Settings that do not change what the run is are only noted: a longer run is the usual case.
    train.main(args + ["--resume", "--EVAL_EVERY=5"])
    assert "with changed settings: EVAL_EVERY=5 (checkpoint: 0)" in capsys.readouterr().out


def test_resume_refuses_a_changed_evisd_setting_and_reads_a_missing_one_as_default(run_copy):
    out, args = run_copy
    with pytest.raises(SystemExit, match=r"another run: EVISD_LAMBDA=0.5 \(checkpoint: 0.2\)"):
        train.main(args + ["--resume", "--EVISD_LAMBDA=0.5"])
    # A checkpoint saved before a knob existed: the missing key reads as today's default, an
    # "auto" one (SFT_LR) as the value "auto" gives the checkpoint's model.
    for name in ckpt_names(out):
        path = os.path.join(out, name, "state.pt")
        state = torch.load(path, weights_only=False)
        del state["config"]["ANSWER_AT"], state["config"]["SFT_LR"]
        torch.save(state, path)
    train.main(args + ["--resume", "--RL_STEPS=3"])
    assert [r["step"] for r in rows(out) if not r.get("eval")] == [0, 1, 2]
    with pytest.raises(SystemExit, match=r"another run: ANSWER_AT='tag' \(checkpoint: 'content'\)"):
        train.main(args + ["--resume", "--RL_STEPS=4", "--ANSWER_AT=tag"])


def test_resume_under_another_embedded_shape_stops_before_any_work(run_copy, monkeypatch):
    """A run saved before `tiny` was reshaped cannot go on: it stops at once, not after a
    warm-up."""
    out, args = run_copy
    old = model.SIZES["tiny"]
    monkeypatch.setitem(model.SIZES, "tiny", (old[0], old[1] + 1) + tuple(old[2:]))
    monkeypatch.setattr(train.warmup, "run", lambda *a: pytest.fail("the warm-up ran"))
    with pytest.raises(SystemExit, match="another shape than today's model.SIZES"):
        train.main(args + ["--resume"])


def test_sigterm_saves_and_exits_like_ctrl_c(finished, tmp_path):
    out = tmp_path / "run"
    log = open(tmp_path / "output.txt", "w")
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, "--RL_STEPS=1000",
                             "--CKPT_EVERY=1000", "--EVAL_EVERY=0", f"--OUT_DIR={out}",
                             f"--SFT_DIR={finished}/sft"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not runs.read_metrics(out):   # the first RL step is logged
            assert proc.poll() is None, open(tmp_path / "output.txt").read()
            assert time.monotonic() < deadline, "no RL step logged within 120 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM, open(tmp_path / "output.txt").read()
    finally:
        proc.kill()
    steps = len(rows(out))
    assert f"interrupted: saving step {steps}" in open(tmp_path / "output.txt").read()
    path, _, _, state = runs.load_checkpoint(str(out))
    assert path == str(out / f"ckpt-{steps:06d}") and state["step"] == steps


# ----------------------------------------------------------------------------- a stop anywhere
STOPPED = TINY + ["--RL_STEPS=4", "--EVAL_EVERY=2", "--CKPT_EVERY=2"]   # PPO_EPOCHS=2


@pytest.fixture
def moving(monkeypatch):
    """Every step updates the weights: advantages drawn from the step's own seeded RNG (after its
    rollout), as a resumed step draws them again, where a tiny warm-up's rewards would all be 0."""
    monkeypatch.setattr(train.grpo, "group_advantages",
                        lambda rewards, group_size: torch.randn(len(rewards)))
    old = signal.signal(signal.SIGTERM, runs.stop_on_sigterm)   # as python train.py has it
    yield
    signal.signal(signal.SIGTERM, old)


@pytest.fixture(scope="module")
def uninterrupted(finished, tmp_path_factory):
    """The run the stopped ones must become: its log rows and final weights."""
    out = tmp_path_factory.mktemp("whole") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train.grpo, "group_advantages",
                   lambda rewards, group_size: torch.randn(len(rewards)))
        lm = train.main(STOPPED + [f"--OUT_DIR={out}", f"--SFT_DIR={finished}/sft"])
    return strip_timing(rows(out)), {k: v.clone() for k, v in lm.state_dict().items()}


# (what, the function, its call that the stop comes in, before or after the call). With the
# warm-up cached, the calls of a 4-step run: rollouts 2 per quick check (steps 0, 2, 4) and 1 per
# step; 2 backward passes and optimizer steps per step; a log row per step and quick check.
# A stop in the rollout, where nothing is held, is test_sigterm_saves_and_exits_like_ctrl_c's; these
# are the points where a stop once applied an update twice or lost a quick check, and the save.
STOPS = [("after the first optimizer step of step 2", "torch.optim.AdamW.step", 5),
         ("after step 2's log row", "runs.log_metrics", 5),
         ("after the quick check at 2, before its row", "evaluate.heldout_em", 2),
         ("in the save of step 2", "model.save_checkpoint_dir", 1)]


@pytest.mark.parametrize("where, target, nth", STOPS, ids=[s[0] for s in STOPS])
def test_a_stop_anywhere_in_a_step_resumes_to_the_same_run(finished, tmp_path, uninterrupted,
                                                           moving, monkeypatch, where, target,
                                                           nth):
    """SIGTERM right after each of these calls, then --resume: the same log rows as the
    uninterrupted run, timings aside, and the same final weights, bit for bit (an update applied
    twice, or a quick check lost, would show)."""
    owner, name = target.rsplit(".", 1)
    owner = {"runs": runs, "torch.optim.AdamW": torch.optim.AdamW, "evaluate": evaluate,
             "model": model}[owner]
    real, calls = getattr(owner, name), []

    def stopping(*args, **kwargs):
        calls.append(1)
        out = real(*args, **kwargs)
        if len(calls) == nth:
            signal.raise_signal(signal.SIGTERM)
        return out
    monkeypatch.setattr(owner, name, stopping)
    args = STOPPED + [f"--OUT_DIR={tmp_path}/run", f"--SFT_DIR={finished}/sft"]
    with pytest.raises(SystemExit) as stop:
        train.main(args)
    assert stop.value.code == 128 + signal.SIGTERM and len(calls) >= nth
    saved = runs.load_checkpoint(str(tmp_path / "run"))[3]["step"]
    assert 2 <= saved <= 3                                   # stopped in step 2, not at the end
    monkeypatch.setattr(owner, name, real)
    lm = train.main(args + ["--resume"])
    want_rows, want_weights = uninterrupted
    assert strip_timing(rows(tmp_path / "run")) == want_rows
    assert all(torch.equal(v, want_weights[k]) for k, v in lm.state_dict().items())
