"""Tests for evaluate.py: the intervals against values worked by hand, the paired macro on
hand-made rows, the quick check on a tiny untrained model, and what main prints and writes."""
import json
import math
import os

import pytest

import evaluate
import model
import train


def test_wilson_interval_by_hand():
    lo, hi = evaluate.wilson(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = evaluate.wilson(0, 100)       # sensible at 0, where p ± z·se would be [0, 0]
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.0370, abs=1e-4)


def test_t_interval_by_hand():
    # Student's t_0.975 from its table (1, 9, 29 degrees of freedom), then the normal's.
    assert [evaluate.t_975(d) for d in (1, 9, 29, 40)] == [12.706, 2.262, 2.045, 1.96]
    m, lo, hi = evaluate.t_interval([1.0, 2.0, 3.0, 4.0])
    half = 3.182 * math.sqrt(5 / 3) / 2          # t_0.975(3) · s / √n, s² = 5/3
    assert m == 2.5 and lo == pytest.approx(2.5 - half) and hi == pytest.approx(2.5 + half)
    assert evaluate.t_interval([0.5]) == (0.5, None, None)


def rows_of(groups):
    """Hand-made run rows: {(group, method): [macro of seed 0, 1, ...]}, hop1 = hop2 = macro."""
    return [dict(run=f"out/{g}-s{s}", group=g, method=m, seed=s, macro=v, hop1=v, hop2=v)
            for (g, m), vals in groups.items() for s, v in enumerate(vals)]


def test_paired_macro_seed_by_seed():
    rows = rows_of({("evisd", "evisd"): (0.5, 0.6, 0.7), ("grpo", "grpo"): (0.4, 0.6, 0.5),
                    ("ppo", "ppo"): (0.4,)})
    rows.append(dict(group="evisd", method="evisd", seed=9, macro=1.0))
    rows[-2]["macro"] = None                     # a run without a macro pairs with nothing
    p = evaluate.paired_macro(rows)
    assert list(p) == ["evisd"] and p["evisd"]["baseline"] == "grpo"
    assert p["evisd"]["seeds"] == [0, 1, 2]      # seed 9 has no pair
    assert list(p["evisd"]["diff"].values()) == pytest.approx([0.1, 0.0, 0.2])
    assert p["evisd"]["macro"] == pytest.approx(evaluate.t_interval([0.1, 0.0, 0.2]))
    # The other way round, by name; two GRPO groups are ambiguous; an unknown name is refused.
    back = evaluate.paired_macro(rows, baseline="evisd")["grpo"]
    assert back["macro"][0] == pytest.approx(-0.1)
    twice = rows + [dict(r, group="grpo-lr") for r in rows if r["group"] == "grpo"]
    assert evaluate.paired_macro(twice) == {}
    with pytest.raises(SystemExit, match="no such run group; have evisd, grpo, ppo"):
        evaluate.paired_macro(rows, baseline="a2c")


def test_quick_check_macro_is_the_mean_of_one_and_two_hop_em():
    """heldout_em on a tiny untrained model: its keys, and one word, one meaning: the quick
    check's macro is the held-out table's (1- and 2-hop)."""
    cfg = dict(train.DEFAULTS, WORLD_SCALE=0.3, MAX_TURNS=2, MAX_NEW_TOKENS=8)
    tok = model.build_tokenizer(model.tokenizer_texts(seeds=(0,)))
    em = evaluate.heldout_em(model.build_model(tok, "tiny"), tok, cfg, n=30)
    assert set(em) == {"test", "ood", "hop1", "hop2", "hop3", "macro"}
    assert (em["hop3"] == em["ood"]
            and em["macro"] == pytest.approx((em["hop1"] + em["hop2"]) / 2, abs=1e-4))


def test_main_prints_em_by_hops_and_the_paired_macro(tmp_path, monkeypatch, capsys):
    rows = {r["run"]: r for r in rows_of({("evisd", "evisd"): (0.5, 0.7),
                                          ("grpo", "grpo"): (0.4, 0.5)})}
    for r in rows.values():
        r.update(warmup_macro=None, macro_ci=[r["macro"] - 0.1, r["macro"] + 0.1], hop3=0.0,
                 **{f"hop{h}{k}": v for h in evaluate.HOPS
                    for k, v in (("_ci", [0.0, 1.0]), ("_n", 10))})
    monkeypatch.setattr(evaluate, "run_summary",
                        lambda run, *a: rows[os.path.relpath(run, tmp_path)])
    for run in rows:
        os.makedirs(tmp_path / run)
    js = str(tmp_path / "em.json")
    evaluate.main([str(tmp_path / run) for run in rows] + ["--json", js])
    printed = capsys.readouterr().out.splitlines()
    assert "out/evisd-s1 (seed 1, evisd; warm-up macro –): EM [95%]" in printed
    assert "  hop1  0.700 [0.000, 1.000] (n=10)" in printed
    assert "  macro 0.700 [0.600, 0.800]" in printed
    half = 12.706 * math.sqrt(0.005) / math.sqrt(2)         # diffs 0.1, 0.2: s² = 0.005
    assert (f"evisd − grpo, paired by seed (n=2): macro EM +0.150 [{0.15 - half:+.3f}, "
            f"{0.15 + half:+.3f}]") in printed[-1]
    got = json.load(open(js))
    assert [r["run"] for r in got["runs"]] == list(rows)
    assert got["paired"]["evisd"]["diff"] == pytest.approx({"0": 0.1, "1": 0.2})
    with pytest.raises(SystemExit, match="no such run directory: nowhere"):
        evaluate.main(["nowhere"])
