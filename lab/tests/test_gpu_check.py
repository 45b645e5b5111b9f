"""lab/gpu_check.py: its dry mode runs every part on the CPU at tiny sizes, so the script is
known to work before a GPU ever sees it; a failing or overlong part is recorded and the next
one still runs."""
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

# the repository
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("gpu_check",
                                              os.path.join(ROOT, "lab", "gpu_check.py"))
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


# Every part is a process of its own (80 s here): CI runs it in a step of its own (pytest.ini).
@pytest.mark.ci_step
def test_dry_mode_runs_every_part_and_writes_the_report(tmp_path):
    out = tmp_path / "out"
    parts = list(gpu_check.PARTS) + ["tests", "bench", "torchrun"]
    proc = subprocess.run([sys.executable, "lab/gpu_check.py", str(out), "--dry", "--work",
                           str(tmp_path / "work"), "--parts", ",".join(parts)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.load(open(out / "gpu-check.json"))["parts"]
    assert list(results) == parts
    assert all(p["status"] == "ok" for p in results.values()), {
        k: p.get("error") for k, p in results.items()}
    f = {name: p["figures"] for name, p in results.items()}
    assert f["versions"]["torch"] and f["versions"]["device"] == "cpu"
    # train: tiny and small, 2 RL steps each, and the KL exactly 0 at step 0
    for name in ("tiny", "small"):
        run = f["train"][name]
        assert run["rl_steps"] == 2 and run["warmup_s"] > 0 and run["heldout_last"]["step"] == 2
        assert run["kl_step0"] == 0.0 and run["dtype"] == "float32"
    # decode: the same episodes from both paths, in float32 and under bf16 autocast
    assert f["decode"]["float32"]["identical_share"] == 1.0
    assert f["decode"]["bfloat16"]["identical_share"] >= gpu_check.BF16_IDENTICAL
    for kind in ("search", "answer"):
        assert f["rounding"][kind]["tokens"] > 0
        assert f["rounding"][kind]["share"] > 0     # the guard: on a trained model, not here
    # the rollout table: both eager decode paths, plain generate and the roofline, per config
    for config in ("tiny", "tiny-shape"):
        row = f["rollout"][config]
        assert row["rollout_static_tok_s"] > 0 and row["rollout_generate_tok_s"] > 0
        assert row["generate_tok_s"] > 0 and 0 < row["rollout_static_of_roofline"] < 1
    # the tiny stand-in of the Qwen shape: 2 x 2 episodes, all scored, every weight trained,
    # and under LoRA only the adapter; the KL exactly 0 at step 0 either way
    assert len(f["memory"]) == 2 and len(f["memory-lora"]) == 1
    for probe in f["memory"].values():
        assert probe["params"] > 0 and probe["episodes"] == 4 and probe["finite_loss"]
        assert probe["peak_rss_gb"] > 0 and probe["modulated_frac"] > 0
        assert probe["lora_rank"] == 0 and probe["trainable_params"] == probe["params"]
    for probe in f["memory-lora"].values():
        assert probe["lora_rank"] == 4 and 0 < probe["trainable_params"] < probe["params"]
        assert probe["episodes"] == 4 and probe["finite_loss"] and probe["peak_rss_gb"] > 0
        assert probe["modulated_frac"] > 0 and len(probe["update_s"]) == 2
    for probe in [*f["memory"].values(), *f["memory-lora"].values()]:
        assert probe["kl_step0"] == 0.0 and probe["layers"] == 2
    # the extra parts
    assert f["tests"]["passed"] > 0 and f["tests"]["failed"] == f["tests"]["errors"] == 0
    assert f["bench"]["evisd_step_over_grpo_step"] > 0 and f["bench"]["tiny"]["episodes"] == 4
    assert f["torchrun"] == {"processes": 1, "backend": "gloo", "rows": 2, "checkpoint": True}
    # the one-screen summary: a PASS line per part, on the screen and in its file
    summary = open(out / "gpu-check-summary.txt").read()
    assert summary.strip() in proc.stdout
    assert [line.split()[1] for line in summary.splitlines() if line.startswith("PASS")] == parts
    assert len(summary.splitlines()) <= 24 and "all parts pass" in summary
    report = open(out / "gpu-check.md").read()
    assert "| torchrun | ok |" in report and "| tiny: rl_step_s |" in report
    assert "$ " in open(out / "gpu-check.log").read()          # every command and its output


def test_a_failing_part_is_recorded_and_the_next_still_runs(tmp_path):
    check = gpu_check.Check(str(tmp_path), str(tmp_path), dry=True, budget=60)

    def broken(check):
        raise ValueError("a bug in a part")

    def slow(check):
        rc, output = check.python(
            "-c", "import time; print('started', flush=True); time.sleep(60)", timeout=1)
        gpu_check.expect(rc, output, "sleeper", {"partial": 1})

    started = time.monotonic()
    gpu_check.run_parts(check, ["versions", "memory", "train"],
                        {"versions": broken, "memory": slow, "train": lambda check: {"fine": True}})
    assert time.monotonic() - started < 30                       # the time box killed the sleeper
    r = json.load(open(tmp_path / "gpu-check.json"))["parts"]
    assert r["versions"]["status"] == "failed" and "a bug in a part" in r["versions"]["error"]
    assert r["memory"]["status"] == "timed out" and r["memory"]["figures"] == {"partial": 1}
    assert "started" in r["memory"]["error"]                     # the end of its output is kept
    assert r["train"] == {"status": "ok", "seconds": r["train"]["seconds"],
                          "figures": {"fine": True}}
