"""Tests for train.py and evaluate.py: overrides and presets, a smoke run of the real loop,
resume, eval, and warm-up-free RL on a pretrained-style stand-in."""
import glob
import importlib.util
import json
import os
import random
import shutil

import pytest
import torch

import evaluate
import evisd
import model
import runs
import toy_world
import train
from conftest import DEVICE
from transformers import AutoModelForCausalLM, AutoTokenizer

TINY = ["--WORLD_SCALE=0.15", "--SFT_STEPS=4", "--SFT_BATCH=4", "--RL_STEPS=4",
        "--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=2", "--MAX_NEW_TOKENS=12", "--MAX_TURNS=2",
        "--EVAL_QUESTIONS=3", "--EVAL_EVERY=2", "--CKPT_EVERY=2", "--PPO_EPOCHS=2",
        f"--DEVICE={DEVICE}"]
DEFAULTS = train.DEFAULTS
TIMING = ("step_s", "rollout_s", "teacher_s")


def run(tmp_path, name, *extra):
    out = str(tmp_path / name)
    train.main(TINY + [f"--OUT_DIR={out}", f"--SFT_DIR={tmp_path}/sft"] + list(extra))
    return out


def rows(out):
    return [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]


def strip_timing(rs):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rs]


@pytest.mark.parametrize("arg, message", [
    ("--NOPE=1", "unknown setting 'NOPE'; allowed: .*METHOD"),
    ("--METHOD=ppo", "allowed values are evisd, grpo, rlsd, opsd"),
    ("--RL_STEPS=1.5", "expected int"),
    ("--LR=fast", "expected float"),
    ("--USE_SEARCH_EVIDENCE=1", "expected bool"),
    ("--DEVICE=tpu", "allowed values are auto, cpu, cuda"),
    ("--GROUP_SIZE=1", "GROUP_SIZE=1: allowed values are >= 2"),
    # Every number's range, before any work starts (each of these once ran minutes, or crashed).
    ("--TOP_K=0", "^TOP_K=0: allowed values are >= 1$"),
    ("--MAX_TURNS=0", "^MAX_TURNS=0: allowed values are >= 1$"),
    ("--SFT_BATCH=0", "^SFT_BATCH=0: allowed values are >= 1$"),
    ("--QUESTIONS_PER_STEP=0", "^QUESTIONS_PER_STEP=0: allowed values are >= 1$"),
    ("--TEMPERATURE=0", "^TEMPERATURE=0.0: allowed values are > 0$"),
    ("--MAX_NEW_TOKENS=0", "^MAX_NEW_TOKENS=0: allowed values are >= 1$"),
    ("--EVISD_LAMBDA=1", "^EVISD_LAMBDA=1.0: allowed values are >= 0 and < 1$"),
    ("--EVISD_TAU=0", "^EVISD_TAU=0.0: allowed values are > 0$"),
    ("--LORA_RANK=-4", "^LORA_RANK=-4: allowed values are >= 0$"),
    ("--LORA_RANK=1.5", "expected int"),
    ("--LORA_ALPHA=0", "^LORA_ALPHA=0.0: allowed values are > 0$"),
    ("--LR=-0.5", r"^LR=-0.5: allowed values are > 0 \(or auto\)$"),
    ("--LR=fast", 'expected float like 0.0002 or "auto"'),
    ("--SFT_NOISE=2", "^SFT_NOISE=2.0: allowed values are from 0 to 1$"),
    ("--SEED=-1", "^SEED=-1: allowed values are >= 0 and < 2\\^63$"),
    # every number is >= 0 without a limit of its own
    ("--SFT_STEPS=-1", "^SFT_STEPS=-1: allowed values are >= 0$"),
    ("--KL_COEF=-0.1", "^KL_COEF=-0.1: allowed values are >= 0$"),
    ("RL_STEPS=3", "use --NAME=value"),
    ("--resume --overwrite", "--resume continues the run in OUT_DIR and --overwrite deletes it"),
    ("config/no-such-preset.py", "no config file"),
])
def test_override_errors(arg, message):
    with pytest.raises(SystemExit, match=message):
        train.configure(arg.split())


@pytest.mark.parametrize("args, message", [
    (["--EVISD_SPAN=all"], "^EVISD_SPAN='all': allowed values are content, action, response$"),
    (["--TEACHER_CONTEXT=both"], "^TEACHER_CONTEXT='both': allowed values are aligned, shared$"),
    # the gated-loss row is response-wide: a narrower span would go unread, so it is refused
    (["--EVISD_FORM=gated_loss"], r"EVISD_SPAN='response' too \(got 'content'\)"),
    (["--EVISD_FORM=gated_loss", "--EVISD_SPAN=content"], r"too \(got 'content'\)"),
])
def test_evisd_settings_are_checked_by_evisd(args, message):
    with pytest.raises(SystemExit, match=message):
        train.configure(args)


def test_settings_without_effect_are_named():
    assert train.unread_settings(train.configure([])[0]) == []
    cfg, _, _ = train.configure(["--METHOD=grpo", "--EVISD_LAMBDA=0.5", "--EVISD_TAU=5"])
    assert train.unread_settings(cfg) == ["EVISD_LAMBDA=0.5 (under METHOD='grpo')"]
    cfg, _, _ = train.configure(["--EVISD_GATE_COEF=0.1", "--USE_SEARCH_EVIDENCE=False",
                                 "--EVIDENCE_AT=first"])
    assert train.unread_settings(cfg) == ["EVISD_GATE_COEF=0.1 (under EVISD_FORM='bounded')",
                                          "EVIDENCE_AT='first' (under USE_SEARCH_EVIDENCE=False)"]
    cfg, _, _ = train.configure(["--EVISD_FORM=gated_loss", "--EVISD_SPAN=response",
                                 "--EVISD_LAMBDA=0.3"])
    assert train.unread_settings(cfg) == ["EVISD_LAMBDA=0.3 (under EVISD_FORM='gated_loss')"]
    # LoRA's scale without an adapter; with one, it is read
    cfg, _, _ = train.configure(["--LORA_ALPHA=16"])
    assert train.unread_settings(cfg) == ["LORA_ALPHA=16.0 (under LORA_RANK=0)"]
    assert train.unread_settings(train.configure(["--LORA_ALPHA=16", "--LORA_RANK=8"])[0]) == []
    # the data's settings on the toy world, the warm-up's without one, the answer's placement
    # when every token is scored: each declared beside its knob, one condition named
    cfg, _, _ = train.configure(["--CORPUS=c.jsonl", "--SFT_STEPS=0", "--SFT_LR=0.01",
                                 "--EVISD_SPAN=response", "--ANSWER_AT=tag"])
    assert train.unread_settings(cfg) == ["CORPUS='c.jsonl' (under DATA='toy')",
                                          "SFT_LR=0.01 (under SFT_STEPS=0)",
                                          "ANSWER_AT='tag' (under EVISD_SPAN='response')"]
    # "auto" left as it is is no change, whatever it became
    assert train.unread_settings(train.configure(["--SFT_STEPS=0"])[0]) == []


def test_unread_declarations_name_real_settings():
    """Each declaration names constants of train.py and values they can take."""
    for name, conditions in {**train.UNREAD_WHEN, **evisd.KNOBS}.items():
        assert name in train.DEFAULTS, name
        for other, value in conditions.items():
            assert type(value) is type(train.DEFAULTS[other]), (name, other)
            train.configure([f"--{other}={value}"] + (
                ["--EVISD_SPAN=response"] if value == "gated_loss" else []))


def test_the_without_effect_note_comes_before_a_refusal(tmp_path, capsys):
    """A GRPO run given an EviSD knob, into an OUT_DIR that holds a run: the note is printed,
    then the reused OUT_DIR stops it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(SystemExit, match="already holds a run"):
        train.main(["--METHOD=grpo", "--EVISD_TAU=2.0", f"--OUT_DIR={tmp_path}/run"])
    assert "note: without effect: EVISD_TAU=2.0 (under METHOD='grpo')" in capsys.readouterr().out


def test_lora_without_peft_stops_in_one_line(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "peft" else find_spec(name, *args))
    with pytest.raises(SystemExit, match="^LORA_RANK > 0 trains a LoRA adapter with peft: "
                                         "pip install peft$"):
        train.main(["--LORA_RANK=8", f"--OUT_DIR={tmp_path}/run"])
    assert not os.path.exists(tmp_path / "run")          # before any work


def test_an_empty_model_directory_is_named_before_any_work(tmp_path):
    with pytest.raises(SystemExit,
                       match="has no config.json, so it is not a Hugging Face model directory"):
        train.configure([f"--MODEL={tmp_path}"])


def test_presets_do_not_repeat_each_other():
    presets = glob.glob(os.path.join(os.path.dirname(train.__file__), "config", "*.py"))
    lines = [{l for l in open(p) if "=" in l and not l.startswith(("OUT_DIR", "MODEL"))}
             for p in presets]
    for i, a in enumerate(lines):
        for b in lines[i + 1:]:
            assert len(a & b) <= 2, a & b


def test_lora_presets_are_the_papers_recipe_on_an_adapter():
    three = train.configure(["config/qwen2.5-3b-instruct-lora.py"])[0]
    seven = train.configure(["config/qwen2.5-3b-instruct-lora.py",
                             "config/qwen2.5-7b-instruct-lora.py"])[0]
    alone = train.configure(["config/qwen2.5-7b-instruct-lora.py"])[0]
    for cfg in (three, seven):   # the paper's: 8 rollouts, KL 0.001, 300 steps; LR 10 x its 1e-6
        assert (cfg["GROUP_SIZE"], cfg["KL_COEF"], cfg["RL_STEPS"]) == (8, 1e-3, 300)
        assert cfg["LR"] == 1e-5
    assert [c["MODEL"] for c in (three, seven)] == ["Qwen/Qwen2.5-3B-Instruct",
                                                   "Qwen/Qwen2.5-7B-Instruct"]
    assert (three["QUESTIONS_PER_STEP"], seven["QUESTIONS_PER_STEP"]) == (5, 4)
    # never a full fine-tuning of the 7B model, not even given alone
    for cfg in (three, seven, alone):
        assert cfg["LORA_RANK"] == 16 and cfg["SFT_STEPS"] == 0


def test_overrides_parse_types():
    cfg, resume, overwrite = train.configure(["--LR=1", "--METHOD=grpo",
                                              "--USE_SEARCH_EVIDENCE=False", "--resume",
                                              "--OUT_DIR=out/x"])
    assert cfg["LR"] == 1.0 and isinstance(cfg["LR"], float)
    assert cfg["METHOD"] == "grpo" and cfg["USE_SEARCH_EVIDENCE"] is False
    assert resume and not overwrite
    assert cfg["OUT_DIR"] == "out/x" and cfg["SEED"] == DEFAULTS["SEED"]


def test_auto_learning_rates_depend_on_the_model():
    embedded, _, _ = train.configure([])
    auto = ("LR", "SFT_LR", "SFT_PRIVILEGED_FRAC", "SFT_CONTEXT_LOSS")
    assert tuple(embedded[k] for k in auto) == (2e-4, 3e-3, 0.3, 1.0)
    hf, _, _ = train.configure(["--MODEL=Qwen/Qwen2.5-0.5B-Instruct"])
    # a pretrained model reads documents already
    assert tuple(hf[k] for k in auto) == (1e-6, 1e-5, 0.0, 0.0)
    chosen, _, _ = train.configure(["--MODEL=some/model", "--LR=3e-6"])
    assert chosen["LR"] == 3e-6                                   # an explicit value wins


def test_config_file_then_overrides_in_order(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(
        '"""An experiment."""\nMETHOD = "grpo"\nLR = 1e-5\nRL_STEPS = 3\n'
        'USE_SEARCH_EVIDENCE = False\n')
    cfg, _, _ = train.configure([str(path), "--RL_STEPS=5"])
    assert ((cfg["METHOD"], cfg["LR"], cfg["RL_STEPS"], cfg["USE_SEARCH_EVIDENCE"])
            == ("grpo", 1e-5, 5, False))
    cfg, _, _ = train.configure(["--RL_STEPS=5", str(path)])
    assert cfg["RL_STEPS"] == 3                                   # the later argument wins


@pytest.mark.parametrize("text, message", [
    ("import os", "line 1: only plain assignments NAME = value"),
    ('LR = 1e-6\nos.system("x")', "line 2: only plain assignments"),
    ("LR: float = 1e-6", "only plain assignments"),
    ("LR = RL_STEPS = 1", "only plain assignments"),
    ("LR = 2 * 1e-6", "line 1: LR: the value must be a literal"),
    ("LR = __import__('os')", "the value must be a literal"),
    ("LR = 'fast'", "line 1: LR=\"'fast'\": expected float like 0.0002 or \"auto\""),
    ("KL_COEF = 'x'", "line 1: KL_COEF=\"'x'\": expected float like the default"),
    ("NOPE = 1", "line 1: unknown setting 'NOPE'; allowed: .*METHOD"),
    ("METHOD = 'ppo'", "allowed values are evisd, grpo"),
    ("LR = (", "line 1: not a valid config file"),
])
def test_config_file_errors_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "bad.py"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message) as e:
        train.configure([str(path)])
    assert str(path) in str(e.value)


@pytest.mark.parametrize("preset", sorted(glob.glob(
    os.path.join(os.path.dirname(train.__file__), "config", "*.py"))))
def test_presets_parse_and_pretrained_models_get_small_rates(preset):
    if preset.endswith("qwen2.5-7b-instruct-lora.py"):    # the 3B recipe at 7B goes after it
        preset = ["config/qwen2.5-3b-instruct-lora.py", preset]
    # a data preset goes after a model preset; its files are fixtures here
    elif "DATA = " in open(preset).read():
        pytest.importorskip("lab.real_data")
        data = os.path.join(os.path.dirname(train.__file__), "lab", "tests", "data")
        preset = ["config/qwen2.5-0.5b-instruct.py", preset,
                  f"--DATA_TRAIN={data}/hotpot_train_v1.1.json",
                  f"--DATA_DEV={data}/hotpot_dev_distractor_v1.json"]
    cfg, _, _ = train.configure(preset if isinstance(preset, list) else [preset])
    if cfg["MODEL"] not in model.SIZES:
        assert cfg["LR"] <= 1e-5 and cfg["SFT_LR"] <= 1e-5 and cfg["SFT_STEPS"] == 0


def test_smoke_run_resume_and_evaluate(tmp_path):
    full = run(tmp_path, "full")
    logged = rows(full)
    steps = [r for r in logged if not r.get("eval")]
    evals = [r for r in logged if r.get("eval")]
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    assert [r["step"] for r in evals] == [0, 2, 4]
    for key in ("reward", "em", "kl", "clip_frac", "modulated_frac", "turns", "tokens",
                "step_s", "rollout_s", "teacher_s"):
        assert key in steps[0], key
    assert 0.0 <= steps[0]["modulated_frac"] <= 1.0
    assert {"eval_test", "eval_ood", "eval_macro"} <= set(evals[0])
    # Checkpoint layout: one HF directory (model + tokenizer) with the training state; the last
    # two are kept, so a damaged newest one has one to fall back on.
    assert (sorted(n for n in os.listdir(full) if n.startswith("ckpt"))
            == ["ckpt-000002", "ckpt-000004"])
    ckpt = os.listdir(os.path.join(full, "ckpt-000004"))
    for f in ("config.json", "model.safetensors", "tokenizer.json", "state.pt"):
        assert f in ckpt, f
    state = torch.load(os.path.join(full, "ckpt-000004", "state.pt"), weights_only=False)
    assert state["step"] == 4
    assert set(state["optimizer"]) == {"state", "param_groups"}
    assert len([d for d in os.listdir(tmp_path) if d.startswith("sft-")]) == 1

    # 2 steps, then --resume for 2 more: the same metrics as the uninterrupted run.
    part = run(tmp_path, "part", "--RL_STEPS=2")
    assert os.path.isdir(os.path.join(part, "ckpt-000002"))
    run(tmp_path, "part", "--resume")
    assert strip_timing(rows(part)) == strip_timing(logged)

    # evaluate.py: the tables and the JSON rows.
    js = str(tmp_path / "rows.json")
    evaluate.main([full, part, "--worlds", "1", "--json", js])
    got = json.load(open(js))["runs"]
    assert len(got) == 2 and got[0]["hop1"] == got[1]["hop1"] and got[0]["hop1_n"] > 0
    assert got[0]["hop3_n"] > 0 and got[0]["macro"] == (got[0]["hop1"] + got[0]["hop2"]) / 2
    # The lab's measurement is off by default: no oracle labels, no gap statistics.
    assert not [k for k in steps[0] if k.startswith("label_") or "_gap_" in k]


def test_grpo_method_logs_no_modulation(tmp_path, capsys):
    out = run(tmp_path, "grpo", "--METHOD=grpo", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1",
              "--EVISD_TAU=2.0")
    (r,) = rows(out)
    assert r["modulated_frac"] == 0 and r["teacher_s"] == 0.0 and r["ratio"] == pytest.approx(1.0)
    printed = capsys.readouterr().out
    # An EviSD setting a GRPO run leaves unread is named before any work (the warm-up's save).
    assert printed.index("note: without effect: EVISD_TAU=2.0 (under METHOD='grpo')") < \
        printed.index("warm-up:")
    # The run says where it was saved and how to evaluate it.
    assert (f"saved {out}/ckpt-000001 after 1 RL steps; evaluate it: python evaluate.py {out}"
            in printed)


@pytest.mark.parametrize("seed", [0, 13, 19_900_101, 2**63 - 1])
def test_any_seed_trains_on_worlds_never_evaluated_on(seed):
    """Training worlds are named by strings, validation and held-out ones by integers: no
    training world's random stream is one of theirs, however large SEED is."""
    cfg, _, _ = train.configure([f"--SEED={seed}", "--WORLD_SCALE=0.15"])
    low, high = cfg["EVAL_SEED"] - 1000, cfg["EVAL_SEED"] + 100
    assert (evaluate.eval_world_seed(cfg, 0, validation=True) >= low
            and evaluate.eval_world_seed(cfg, 99) < high)
    evaluated = {random.Random(s).random() for s in range(low, high)}
    world_of = lambda stage, step: toy_world.training_world(stage, seed, step, cfg["WORLD_SCALE"])
    for stage, step in (("warmup", 0), ("warmup", 899), ("rl", 0), ("rl", 59)):
        world = world_of(stage, step)
        assert isinstance(world.seed, str) and random.Random(world.seed).random() not in evaluated
    assert (world_of("rl", 1).docs != world_of("rl", 2).docs
            and world_of("rl", 1).docs != world_of("warmup", 1).docs)
    runs.seed_everything("rl", seed, 59, 0)
    first = torch.rand(1)
    runs.seed_everything("rl", seed, 59, 1)
    assert not torch.equal(first, torch.rand(1))   # each rank its own stream


def test_paired_table_on_tiny_runs(tmp_path, capsys):
    evisd_run = run(tmp_path, "evisd-s0", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1")
    grpo_run = run(tmp_path, "grpo-s0", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1",
                   "--METHOD=grpo")
    js = str(tmp_path / "rows.json")
    evaluate.main([evisd_run, grpo_run, "--worlds", "1", "--json", js])
    got = json.load(open(js))
    by_group = {r["group"]: r for r in got["runs"]}
    pair = got["paired"]["evisd"]
    assert pair["baseline"] == "grpo" and pair["seeds"] == [0]
    assert pair["diff"]["0"] == pytest.approx(by_group["evisd"]["macro"]
                                              - by_group["grpo"]["macro"])
    assert "evisd − grpo, paired by seed (n=1): macro EM " in capsys.readouterr().out


def test_pretrained_standin_runs_rl_without_warmup_and_evaluates(tmp_path, standin_dir):
    """`python train.py --MODEL=<dir>` and the Qwen preset on the pretrained-style stand-in:
    RL from the model as it is, auto (tiny) learning rate, tags as text, and evaluate.py on the
    result. Its random weights write garbage, so this checks the path, not learning."""
    vocab = len(AutoTokenizer.from_pretrained(standin_dir))
    plain = run(tmp_path, "plain", f"--MODEL={standin_dir}", "--SFT_STEPS=0", "--RL_STEPS=2",
                "--MAX_NEW_TOKENS=8")
    preset = str(tmp_path / "preset")
    small = [a for a in TINY if not a.startswith("--SFT_STEPS")]   # the preset's SFT_STEPS=0 stays
    # the preset's file, then overrides
    train.main(["config/qwen2.5-0.5b-instruct.py"] + small + [
        f"--MODEL={standin_dir}", "--RL_STEPS=2", "--MAX_NEW_TOKENS=8", f"--OUT_DIR={preset}",
        f"--SFT_DIR={tmp_path}/sft"])
    for out in (plain, preset):
        cfg = json.load(open(os.path.join(out, "config.json")))
        assert cfg["LR"] == 1e-6 and cfg["SFT_STEPS"] == 0
        assert [r["step"] for r in rows(out) if not r.get("eval")] == [0, 1]
        ckpt = os.path.join(out, "ckpt-000002")
        # no tag was added
        assert len(AutoTokenizer.from_pretrained(ckpt)) == vocab
        lm = AutoModelForCausalLM.from_pretrained(ckpt)
        assert lm.get_input_embeddings().weight.shape[0] == vocab
    assert json.load(open(os.path.join(preset, "config.json")))["GRADIENT_CHECKPOINTING"] is True
    assert not glob.glob(f"{tmp_path}/sft-*")          # no warm-up: no copy of the model on disk
    js = str(tmp_path / "rows.json")
    evaluate.main([plain, preset, "--worlds", "1", "--json", js])
    got = json.load(open(js))["runs"]
    assert len(got) == 2 and all("macro" in r and r["warmup_macro"] is not None for r in got)


def test_a_checkpoint_with_dropout_scores_the_same_tokens_the_same(tmp_path, standin_dir):
    """A pretrained model whose config has attention dropout: RL scores it in train mode, so
    the dropout is switched off, and at step 0 the policy's log-probs equal the frozen
    reference's (KL exactly 0); two scorings of one batch are equal."""
    path = tmp_path / "dropout"
    shutil.copytree(standin_dir, path)
    config = json.load(open(path / "config.json"))
    json.dump(dict(config, attention_dropout=0.5), open(path / "config.json", "w"))
    out = run(tmp_path, "run", f"--MODEL={path}", "--SFT_STEPS=0", "--RL_STEPS=1",
              "--EVAL_EVERY=0", "--METHOD=grpo")
    assert [r["kl"] for r in rows(out) if not r.get("eval")] == [0.0]
    cfg = train.configure(TINY + [f"--MODEL={path}"])[0]
    policy, tok = train.build_policy(cfg, torch.device("cpu"))
    assert policy.model.layers[0].self_attn.attention_dropout == 0.0
    ids = torch.tensor([tok.encode("a question about a person")])
    scores = [model.token_logprobs(policy.train(), ids, torch.ones_like(ids)) for _ in range(2)]
    assert torch.equal(*scores)
