"""A LoRA run end to end, beside the lab's export (lab/export.py): it resumes to the
uninterrupted run's values, evaluate.py scores it and its warm-up, and the export merges it into
a plain HF directory whose log-probs are the LoRA model's."""
import json
import os
import runpy
import sys

import pytest

peft = pytest.importorskip("peft", reason="LoRA needs peft, which this environment lacks")
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import evaluate  # noqa: E402
import model  # noqa: E402
from lab import export  # noqa: E402
from test_train import rows, run, strip_timing  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lora_run(tmp_path, name, *extra):
    # OPSD's advantage is the teacher's gap, so the adapter moves even where every reward is 0,
    # once a warm-up of 40 steps writes actions for the teacher to re-score.
    return run(tmp_path, name, "--LORA_RANK=4", "--METHOD=opsd", "--LR=1e-3", "--SFT_STEPS=40",
               "--PPO_EPOCHS=1", *extra)


def test_a_lora_run_resumes_is_evaluated_and_merges(tmp_path, capsys, monkeypatch):
    full = lora_run(tmp_path, "full")
    logged = [r for r in rows(full) if not r.get("eval")]
    assert logged[0]["kl"] == 0.0 and logged[-1]["kl"] > 0
    # A checkpoint holds the adapter, not the base; its base is named twice.
    ckpt = os.path.join(full, "ckpt-000004")
    assert {"adapter_model.safetensors", "adapter_config.json", "state.pt"} <= set(os.listdir(ckpt))
    assert "model.safetensors" not in os.listdir(ckpt)
    state = torch.load(os.path.join(ckpt, "state.pt"), weights_only=False)
    sft = state["sft_path"]
    assert sft.startswith(f"{tmp_path}/sft-") and os.path.isdir(sft)
    assert json.load(open(os.path.join(ckpt, "adapter_config.json")))[
        "base_model_name_or_path"] == sft

    # 2 steps, then --resume for 2 more: the uninterrupted run's values.
    part = lora_run(tmp_path, "part", "--RL_STEPS=2")
    lora_run(tmp_path, "part", "--resume")
    assert strip_timing(rows(part)) == strip_timing(rows(full))
    # The adapter's shape defines the run: --resume refuses another.
    with pytest.raises(SystemExit, match=r"another run: LORA_RANK=8 \(checkpoint: 4\)"):
        lora_run(tmp_path, "part", "--resume", "--LORA_RANK=8")

    # evaluate.py scores it, and the warm-up it started from.
    js = str(tmp_path / "rows.json")
    evaluate.main([full, "--worlds", "1", "--json", js])
    (got,) = json.load(open(js))["runs"]
    assert got["hop1_n"] > 0 and "macro" in got and got["warmup_macro"] is not None

    # The export, run as its command: a plain HF directory whose log-probs are the LoRA model's.
    merged = str(tmp_path / "merged")
    monkeypatch.setattr(sys, "argv", ["lab/export.py", full, merged])
    runpy.run_path(os.path.join(ROOT, "lab", "export.py"), run_name="__main__")
    assert f"saved {merged}: a plain HF directory" in capsys.readouterr().out
    assert "adapter_config.json" not in os.listdir(merged)
    plain = AutoModelForCausalLM.from_pretrained(merged)
    lora, _ = model.load_model(ckpt)
    ids = torch.randint(5, 300, (3, 40))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want = model.token_logprobs(lora, ids, mask)
        assert (model.token_logprobs(plain, ids, mask) - want).abs().max() < 1e-4
        with model.without_adapter(lora):          # and the adapter made a difference
            assert (model.token_logprobs(lora, ids, mask) - want).abs().max() > 1e-3
    with pytest.raises(SystemExit, match="exists already"):
        export.export(full, merged)
