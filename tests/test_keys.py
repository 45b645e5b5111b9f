"""Every setting has its class, and every read has its key: a constant is in the warm-up's cache
key (warmup.KEYS), the run's key that --resume holds fixed (train.RUN_KEYS), or the settings a
resumed run may change (train.FREE_KEYS). A config that records each key read runs the warm-up,
and whole runs under GRPO, EviSD, each row of the paper's ablation table and LoRA: a constant read
anywhere without its class, or a warm-up reading a run key, fails here."""
import pytest
import torch

import evisd
import train
import warmup
from conftest import needs_peft
from test_evisd import step_batch, setup  # noqa: F401 (fixtures)
from test_train import TINY

# Free settings the warm-up may read: where it is cached and how it computes, not what it learns.
WARMUP_FREE = {"SFT_DIR", "DTYPE", "DEVICE", "GRADIENT_CHECKPOINTING"}


class RecordingConfig(dict):
    """A config that notes the name of every setting read from it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads = set()

    def __getitem__(self, name):
        self.reads.add(name)
        return super().__getitem__(name)

    def get(self, name, default=None):
        self.reads.add(name)
        return super().get(name, default)


def recording_runs(monkeypatch):
    """The RecordingConfig of each train.main call from here on, and advantages drawn at
    random, so that a tiny warm-up's all-zero rewards still wake the teacher."""
    monkeypatch.setattr(train.grpo, "group_advantages",
                        lambda rewards, group_size: torch.randn(len(rewards)))
    configure, recorded = train.configure, []

    def recording(argv):
        cfg, *flags = configure(argv)
        recorded.append(RecordingConfig(cfg))
        return (recorded[-1], *flags)
    monkeypatch.setattr(train, "configure", recording)
    return recorded


def test_every_constant_has_exactly_one_class():
    assert set(warmup.KEYS) <= set(train.RUN_KEYS)
    assert not set(train.RUN_KEYS) & set(train.FREE_KEYS)
    unclassified = set(train.CONFIG_KEYS) - set(train.RUN_KEYS) - set(train.FREE_KEYS)
    assert not unclassified, f"add these to train.RUN_KEYS or train.FREE_KEYS: {unclassified}"
    assert len(set(train.RUN_KEYS)) == len(train.RUN_KEYS)


def test_the_warmup_reads_only_its_cache_key(tmp_path):
    """The model built and warmed up under a recording config: each setting that shapes its
    weights is in the cache key, so a changed one trains a new warm-up (GRAD_CLIP once was not)."""
    cfg = RecordingConfig(train.configure(TINY + [f"--SFT_DIR={tmp_path}/sft"])[0])
    policy, tokenizer = train.build_policy(cfg, torch.device("cpu"))
    warmup.run(cfg, policy, tokenizer)
    assert {"SFT_LR", "SFT_CONTEXT_LOSS", "GRAD_CLIP", "SFT_PRIVILEGED_FRAC"} <= cfg.reads
    assert cfg.reads - set(warmup.KEYS) <= WARMUP_FREE, "read by the warm-up, not in warmup.KEYS"


ROWS = {"grpo": ["--METHOD=grpo"], "evisd": [], "whole response": ["--EVISD_SPAN=response"],
        "gated loss": ["--EVISD_FORM=gated_loss", "--EVISD_SPAN=response"],
        "answer-only": ["--USE_SEARCH_EVIDENCE=False"], "shared": ["--TEACHER_CONTEXT=shared"],
        "our placements": ["--EVIDENCE_AT=first", "--ANSWER_AT=tag", "--EVISD_SPAN=action"],
        "lora": ["--LORA_RANK=4"]}


@pytest.mark.parametrize("row", [r for r in ROWS if r not in ("grpo", "lora")])
def test_the_teacher_reads_only_run_keys(row, step_batch):
    """evisd.credit under each row, on expert episodes that search and answer: every placement
    and span is read, and each is a run key."""
    lm, tok, world, r, adv, lp_s = step_batch
    cfg = RecordingConfig(train.configure(ROWS[row])[0])
    evisd.credit(lm, tok, world, r, adv, lp_s, cfg)
    assert {"EVISD_SPAN", "TEACHER_CONTEXT", "USE_SEARCH_EVIDENCE", "EVIDENCE_AT"} <= cfg.reads
    assert ("ANSWER_AT" in cfg.reads) == (row not in ("whole response", "gated loss"))
    assert cfg.reads <= set(train.RUN_KEYS) | {"TEMPERATURE"}


@pytest.mark.parametrize("row", ["grpo", "evisd", "gated loss",
                                 pytest.param("lora", marks=needs_peft)])
def test_a_run_reads_only_classified_settings(row, tmp_path, monkeypatch):
    """train.main with a recording config: a step, a quick check and a save read run keys and
    free settings only; the method's own knobs among them (the other rows' placements: the
    teacher's test above)."""
    recorded = recording_runs(monkeypatch)
    train.main(TINY + ["--RL_STEPS=1", "--EVAL_EVERY=1", f"--OUT_DIR={tmp_path}/run",
                       f"--SFT_DIR={tmp_path.parent}/sft-keys"] + ROWS[row])
    reads = recorded[0].reads
    assert not reads - set(train.RUN_KEYS) - set(train.FREE_KEYS)
    assert {"LR", "TEMPERATURE", "GRAD_CLIP", "CKPT_EVERY"} <= reads
    if row == "gated loss":
        assert "EVISD_GATE_COEF" in reads
    elif row != "grpo":
        assert {"EVISD_LAMBDA", "EVISD_TAU", "TEACHER_CONTEXT"} <= reads
