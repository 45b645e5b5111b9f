"""Tests for lab/report.py, the lab command: its tables and the power line on hand-made rows, and
end to end on tiny runs of train.py: the four tables, learning speed and curves (lab/curves.py),
the report card (--credit, --variants) and the gap view (--show) of lab/credit.py."""
import json
import os
import subprocess
import sys

import pytest

import evaluate
import runs
import train
from lab import credit, curves, report
from test_evaluate import rows_of
from test_faults import finished, run_copy  # noqa: F401 (fixtures: a finished tiny run, copied)
from test_train import TINY, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_paired_differences_seed_by_seed():
    rows = rows_of({("evisd", "evisd"): (0.5, 0.6, 0.7), ("grpo", "grpo"): (0.4, 0.6, 0.5)})
    rows.append(dict(group="evisd", method="evisd", seed=9, macro=1.0, hop1=1.0, hop2=1.0))
    rows[0]["hop1"] = None                       # a measure one run lacks
    p = report.paired_differences(rows)["evisd"]
    assert p["baseline"] == "grpo" and p["seeds"] == [0, 1, 2]     # seed 9 has no pair
    assert [p["diff"][s]["macro"] for s in (0, 1, 2)] == pytest.approx([0.1, 0.0, 0.2])
    assert p["macro"] == p["intervals"]["macro"] == pytest.approx(
        evaluate.t_interval([0.1, 0.0, 0.2]))
    assert p["diff"][0]["hop1"] is None
    assert p["intervals"]["hop1"] == pytest.approx(evaluate.t_interval([0.0, 0.2]))
    # The baseline is evaluate.baseline_group's (tests/test_evaluate.py): here named.
    assert report.paired_differences(rows, baseline="evisd")["grpo"]["macro"][0] == \
        pytest.approx(-0.1)


def test_speed_pairs_like_em_and_the_summary_table():
    rows = [dict(group=g, method=m, seed=s, macro=v, hop1=v, hop2=v)
            for g, m, vals in (("evisd", "evisd", (0.5, 0.6, 0.7)),
                               ("grpo", "grpo", (0.4, 0.6, 0.5)))
            for s, v in enumerate(vals)]
    keys = report.PAIRED_KEYS + curves.SPEED_KEYS
    p = report.paired_differences(rows, keys=keys)["evisd"]
    assert "partial_clear" not in p["intervals"]              # not logged: no interval
    # Learning speed pairs the same way, over the seeds that have it.
    for r in rows:
        r["partial_clear"] = {("evisd", 0): 5, ("evisd", 1): 8, ("grpo", 0): 9,
                              ("grpo", 1): 8}.get((r["group"], r["seed"]))
    p = report.paired_differences(rows, keys=keys)["evisd"]
    assert [p["diff"][s]["partial_clear"] for s in (0, 1, 2)] == [-4, 0, None]
    assert p["intervals"]["partial_clear"] == pytest.approx(evaluate.t_interval([-4, 0]))
    table = report.summary_table(rows, {"evisd": p})
    assert "| partial_clear | 8.500 | -2.000 [" in table and "| macro | 0.500 | +0.100 [" in table
    assert report.summary_table(rows, {}) == ""


def test_runs_table_rows_have_as_many_cells_as_its_header():
    row = {"run": "r", "seed": 0, "warmup_macro": 0.1, "macro": 0.2, "macro_ci": [0.1, 0.3],
           **{f"hop{h}{k}": v for h in evaluate.HOPS
              for k, v in (("", 0.5), ("_ci", [0.4, 0.6]), ("_n", 10))}}
    lines = report.runs_table([row]).splitlines()
    assert len({line.count("|") for line in lines}) == 1


def test_seeds_for_solves_the_power_line():
    # 10 seeds at sd 0.0207 reach ±0.015 (t_9 · 0.0207 / √10 = 0.01481), not ±0.0147.
    assert report.seeds_for(0.0207, 0.0149) == 10
    assert report.seeds_for(0.0207, 0.0147) == 11
    assert report.seeds_for(0.0, 0.01) == "–"


def test_tables_speed_curves_and_credit_report_end_to_end(tmp_path, capsys):
    evisd_run = run(tmp_path, "evisd-s0", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1")
    grpo_run = run(tmp_path, "grpo-s0", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1",
                   "--METHOD=grpo")
    js = str(tmp_path / "rows.json")
    report.main([evisd_run, grpo_run, "--worlds", "1", "--json", js, "--speed", "--plot",
                 str(tmp_path / "c.png")])
    got = json.load(open(js))
    by_group = {r["group"]: r for r in got["runs"]}
    pair = got["paired"]["evisd"]
    assert pair["baseline"] == "grpo" and pair["seeds"] == [0]
    assert pair["diff"]["0"]["macro"] == pytest.approx(by_group["evisd"]["macro"]
                                                       - by_group["grpo"]["macro"])
    # learning speed, from metrics.jsonl, paired too (None: nothing logged)
    for key in curves.SPEED_KEYS:
        both = None not in (by_group["evisd"][key], by_group["grpo"][key])
        assert pair["diff"]["0"][key] == (
            pytest.approx(by_group["evisd"][key] - by_group["grpo"][key]) if both else None)
    assert by_group["grpo"]["quick_area"] is None          # EVAL_EVERY=0: no quick check to measure
    # the lab's columns beside evaluate.py's row, read off metrics.jsonl
    assert set(report.LAB_COLUMNS) <= set(by_group["grpo"]) and by_group["evisd"]["wall_min"] > 0
    assert 0.0 <= by_group["evisd"]["modulated_frac"] <= 1.0
    out = capsys.readouterr().out
    for table in ("| run | seed | 1-hop EM [95%] |", "| run | seeds | warmup_macro |",
                  "evisd − grpo, paired by seed:", "| measure | grpo (mean of 1) |"):
        assert table in out, table
    assert "mean paired difference and 95% t-interval over 1 seeds" in out and "| macro |" in out
    assert os.path.getsize(tmp_path / "c.png") > 10_000
    # As a command from the repository root (the EM is cached by now).
    done = subprocess.run([sys.executable, "lab/report.py", evisd_run, grpo_run, "--worlds", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "evisd − grpo, paired by seed:" in done.stdout, done.stderr
    # The report card, on the run and on its warm-up checkpoint directory.
    sft = next(os.path.join(tmp_path, d) for d in os.listdir(tmp_path) if d.startswith("sft-"))
    card_path = str(tmp_path / "credit.json")
    report.main([evisd_run, sft, "--credit", "4", "--json", card_path])
    cards = json.load(open(card_path))
    assert set(cards) == {evisd_run, sft}
    for card in cards.values():
        assert (card["episodes"] == 4 * 2
                and set(card["parts"]) >= {"all", "search_tag", "answer_content"})
        assert 0.0 <= card["shares"]["label_invalid"] <= 1.0
    assert "AUC of gap" in capsys.readouterr().out
    # Every design choice on the same samples, on validation worlds: same actions, same labels,
    # same GRPO credit; the variants differ only in what reaches Â.
    report.main([sft, "--credit", "4", "--variants", "--validation", "--json", card_path])
    cards = json.load(open(card_path))[sft]
    assert set(cards) == set(credit.VARIANTS)
    base = cards["as configured"]
    for name, card in cards.items():
        assert card["shares"] == base["shares"] and card["episodes"] == base["episodes"]
        assert card["parts"]["all"]["misassigned_grpo"] == base["parts"]["all"]["misassigned_grpo"]
    kept = cards["as configured"]["parts"]
    for kind in ("search", "answer"):   # the tags keep A: EviSD's misassigned mass there is GRPO's
        assert (kept[f"{kind}_tag"]["misassigned_evisd"]
                == pytest.approx(kept[f"{kind}_tag"]["misassigned_grpo"]))
    assert "| EVISD_SPAN=action |" in capsys.readouterr().out
    # The gap view of one run's episodes.
    report.main([evisd_run, "--show", "1"])
    shown = capsys.readouterr().out
    assert shown.count("Q: ") == 2 and "A=" in shown
    for flags, message in ((["--variants"], "go with --credit"),
                           (["--credit", "2", "--rules", "--variants"], "one at a time")):
        with pytest.raises(SystemExit, match=message):
            report.main([evisd_run] + flags)


def test_model_output_that_is_not_unicode_is_invalid_and_printable(run_copy, monkeypatch, capsys,
                                                                    tmp_path):
    out, _ = run_copy
    load_run = runs.load_run

    def load_run_writing_surrogates(run_dir):   # a model whose every piece ends in a lone surrogate
        lm, tok, cfg, sft_path = load_run(run_dir)
        decode = tok.decode
        tok.decode = lambda ids, **kw: decode(ids, **kw) + "\udcff"
        return lm, tok, cfg, sft_path
    monkeypatch.setattr(runs, "load_run", load_run_writing_surrogates)
    report.main([out, "--show", "1"])
    printed = capsys.readouterr().out
    assert "\\udcff" in printed and "reward=0" in printed and "reward=1" not in printed
    page = str(tmp_path / "credit.html")           # the credit page writes it as text too
    report.main([out, "--credit-page", page])
    assert "\\udcff" in open(page, encoding="utf-8").read()


def test_held_out_em_is_cached_per_checkpoint_and_dtype(run_copy, monkeypatch):
    # A checkpoint never changes: its EM is kept in its heldout-em.json under a key naming the
    # dtype too (bf16 may round a greedy choice the other way), and read back, not recomputed.
    out, _ = run_copy
    report.main([out, "--worlds", "1"])
    report.main([out, "--worlds", "1", "--dtype", "bfloat16"])
    key = report.em_key(runs.load_run(out)[2], 1)
    cache = os.path.join(runs.load_checkpoint(out)[0], "heldout-em.json")
    assert set(json.load(open(cache))) == {key, key + " in bfloat16"}
    monkeypatch.setattr(evaluate, "heldout_by_hops",
                        lambda *a, **k: pytest.fail("recomputed a cached EM"))
    report.main([out, "--worlds", "1", "--dtype", "bfloat16"])


def test_held_out_em_of_lora_runs_is_cached_per_run(tmp_path, monkeypatch):
    """Two LoRA runs of one seed and their warm-up: each is evaluated once and cached in its own
    checkpoint, not under the base a PEFT model names (which would read one EM for all three)."""
    runs_ = [str(tmp_path / f"{m}-s0") for m in ("evisd", "grpo")]
    for out, method in zip(runs_, ("evisd", "grpo")):
        train.main(TINY + ["--LORA_RANK=4", "--RL_STEPS=1", "--EVAL_EVERY=0", f"--METHOD={method}",
                           f"--OUT_DIR={out}", f"--SFT_DIR={tmp_path}/sft"])
    scored, heldout_by_hops = [], evaluate.heldout_by_hops

    def counted(policy, *args):
        scored.append(policy)
        return heldout_by_hops(policy, *args)
    monkeypatch.setattr(evaluate, "heldout_by_hops", counted)
    report.main(runs_ + ["--worlds", "1"])
    assert len(scored) == 3                                  # two runs and the warm-up
    for out in runs_:
        assert os.path.exists(os.path.join(runs.load_checkpoint(out)[0], "heldout-em.json"))
    report.main(runs_ + ["--worlds", "1"])
    assert len(scored) == 3                                  # read back, not recomputed
