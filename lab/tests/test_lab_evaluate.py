"""The lab's features as evaluate.py switches them on (--speed, --plot, --credit, --variants,
--show), on tiny runs of train.py."""
import json
import os

import pytest

import evaluate
import runs
from lab import credit, curves
from test_faults import finished, run_copy  # noqa: F401 (fixtures: a finished tiny run, copied)
from test_train import run


def test_speed_curves_and_credit_report_through_evaluate(tmp_path, capsys):
    evisd_run = run(tmp_path, "evisd-s0", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1")
    grpo_run = run(tmp_path, "grpo-s0", "--RL_STEPS=1", "--EVAL_EVERY=0", "--PPO_EPOCHS=1",
                   "--METHOD=grpo")
    js = str(tmp_path / "rows.json")
    evaluate.main([evisd_run, grpo_run, "--worlds", "1", "--json", js, "--speed", "--plot",
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
    out = capsys.readouterr().out
    assert "mean paired difference and 95% t-interval over 1 seeds" in out and "| macro |" in out
    assert os.path.getsize(tmp_path / "c.png") > 10_000
    # The report card, on the run and on its warm-up checkpoint directory.
    sft = next(os.path.join(tmp_path, d) for d in os.listdir(tmp_path) if d.startswith("sft-"))
    card_path = str(tmp_path / "credit.json")
    evaluate.main([evisd_run, sft, "--credit", "4", "--json", card_path])
    cards = json.load(open(card_path))
    assert set(cards) == {evisd_run, sft}
    for card in cards.values():
        assert (card["episodes"] == 4 * 2
                and set(card["parts"]) >= {"all", "search_tag", "answer_content"})
        assert 0.0 <= card["shares"]["label_invalid"] <= 1.0
    assert "AUC of gap" in capsys.readouterr().out
    # Every design choice on the same samples, on validation worlds: same actions, same labels,
    # same GRPO credit; the variants differ only in what reaches Â.
    evaluate.main([sft, "--credit", "4", "--variants", "--validation", "--json", card_path])
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
    evaluate.main([evisd_run, "--show", "1"])
    assert "gap" in open(os.path.join(evisd_run, "episodes.html")).read()


def test_model_output_that_is_not_unicode_is_invalid_and_printable(run_copy, monkeypatch, capsys):
    out, _ = run_copy
    load_run = runs.load_run

    def load_run_writing_surrogates(run_dir):   # a model whose every piece ends in a lone surrogate
        lm, tok, cfg, sft_path = load_run(run_dir)
        decode = tok.decode
        tok.decode = lambda ids, **kw: decode(ids, **kw) + "\udcff"
        return lm, tok, cfg, sft_path
    monkeypatch.setattr(runs, "load_run", load_run_writing_surrogates)
    evaluate.main([out, "--show", "1"])
    printed = capsys.readouterr().out
    assert "\\udcff" in printed and "reward=0" in printed and "reward=1" not in printed
    assert "\\udcff" in open(os.path.join(out, "episodes.html"), encoding="utf-8").read()
