"""The precision side of the GPU path, checked on the CPU: DTYPE="bfloat16" runs bf16 autocast
here as on CUDA, float16 is refused in one line, and evaluate.py computes on the run's own
DEVICE and DTYPE unless its command line says otherwise. (One RL step per method and row under
bf16, with its KL of exactly 0, is in test_device.py; the decode paths under bf16 and against
CUDA-like attention outputs in lab/tests/test_fast_decode.py; rounding's share of EviSD's
correction in lab/tests/test_rounding.py.)"""
import os

import pytest
import torch

import evaluate
import model
import runs
import train
from test_faults import finished, run_copy  # noqa: F401 (fixtures: a copy of a finished tiny run)


def test_bf16_autocast_runs_on_the_cpu_and_float32_is_untouched():
    lm = model.build_model(model.build_tokenizer(model.tokenizer_texts(seeds=(0,))), "tiny")
    ids = torch.randint(5, 200, (2, 12))
    cpu = torch.device("cpu")
    with model.autocast(cpu, torch.bfloat16):
        h = lm.get_decoder()(input_ids=ids).last_hidden_state
        assert torch.is_autocast_enabled("cpu")
    with model.autocast(cpu, torch.float32):
        assert not torch.is_autocast_enabled("cpu")
    # the projections ran in bf16: a bf16 hidden state differs from the float32 one
    assert not torch.equal(h.float(), lm.get_decoder()(input_ids=ids).last_hidden_state)


def test_float16_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        train.configure(["--DTYPE=float16"])
    assert "DTYPE='float16'" in str(e.value) and "loss scaling" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.fixture
def evaluated(run_copy, monkeypatch):
    """A copy of the finished tiny run, and the dtypes evaluate.py computed its EM in."""
    run, _ = run_copy
    seen = []
    real = model.autocast
    monkeypatch.setattr(model, "autocast", lambda device, dtype: seen.append(
        (device.type, dtype)) or real(device, dtype))
    return run, seen


def test_evaluate_computes_in_the_runs_dtype_or_the_one_asked(evaluated):
    run, seen = evaluated
    cfg = runs.load_run(run)[2]
    assert (cfg["DEVICE"], cfg["DTYPE"]) == ("cpu", "float32")
    evaluate.main([run, "--worlds", "1"])
    assert seen and set(seen) == {("cpu", torch.float32)}
    seen.clear()
    evaluate.main([run, "--worlds", "1", "--dtype", "bfloat16"])
    assert seen and set(seen) == {("cpu", torch.bfloat16)}


def test_evaluate_reads_the_device_and_dtype_the_run_trained_with(evaluated):
    run, seen = evaluated
    for ckpt in [d for d in os.listdir(run) if d.startswith("ckpt-")]:
        state_path = os.path.join(run, ckpt, "state.pt")
        state = torch.load(state_path, weights_only=False)
        state["config"]["DTYPE"] = "bfloat16"        # as a GPU run writes it
        torch.save(state, state_path)
    evaluate.main([run, "--worlds", "1"])
    assert seen and set(seen) == {("cpu", torch.bfloat16)}
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="pass --device cpu"):
            evaluate.main([run, "--worlds", "1", "--device", "cuda"])
