"""Benchmark v5's tables are the committed records' (lab/results/v5-runs.jsonl.gz): the headline
is the paired differences read straight from each run's held-out EM, and rows pair by seed."""
import gzip
import importlib.util
import json
import math
import os
import statistics

import pytest

import evaluate
from lab import report

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "..", "results")
PACK = os.path.join(RESULTS, "v5-runs.jsonl.gz")


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("v5_tables",
                                                  os.path.join(RESULTS, "v5_tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def records(tables):
    return tables.rows(PACK)


@pytest.fixture(scope="module")
def packed():
    """Each run's record in the pack by name, read with the standard library alone."""
    with gzip.open(PACK, "rt") as f:
        return {run["name"]: run for run in map(json.loads, f)}


def macro_of(packed, run):
    """A run's held-out macro EM on the protocol's 18 worlds, read from its record alone."""
    em = packed[run]["heldout_em"]
    return em[report.em_key(packed[run]["config"], 18)]["macro"]


def test_headline_is_the_paired_records(tables, records, packed):
    seeds = [s for s in range(30) if f"grpo-s{s}" in packed and f"evisd-s{s}" in packed]
    assert len(seeds) >= 2
    diffs = [macro_of(packed, f"evisd-s{s}") - macro_of(packed, f"grpo-s{s}") for s in seeds]
    p = report.paired_differences(records, "grpo")["evisd"]
    mean, low, high = p["macro"]
    assert p["seeds"] == seeds
    assert mean == pytest.approx(statistics.mean(diffs), abs=1e-12)
    half = evaluate.t_975(len(seeds) - 1) * statistics.stdev(diffs) / math.sqrt(len(seeds))
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=1e-12)


def test_rows_pair_with_evisd_seed_by_seed(tables, records, packed):
    # Every row's difference on a seed is its run's macro minus that seed's EviSD run's.
    vs_evisd = report.paired_differences(records, "evisd")
    for group, *_ in tables.ROWS:
        for s in vs_evisd[group]["seeds"]:
            expected = macro_of(packed, f"{group}-s{s}") - macro_of(packed, f"evisd-s{s}")
            assert vs_evisd[group]["diff"][s]["macro"] == pytest.approx(expected, abs=1e-12)


def test_points_and_decisions(tables):
    assert tables.points(-0.0131, -0.028, 0.0021) == "−1.3 [−2.8, +0.2]"
    assert tables.decide(-0.01, -0.02, -0.001) == "hurts"
    assert tables.decide(0.01, 0.001, 0.02) == "helps"
    assert tables.decide(0.0, -0.01, 0.01) == "no difference detected"
    # Student's t_0.975 from its table (1, 9, 29 degrees of freedom), then the normal's.
    assert [evaluate.t_975(d) for d in (1, 9, 29, 40)] == [12.706, 2.262, 2.045, 1.96]
    # 10 seeds at v3's sd 0.0207 reach the protocol's planned ±0.015 (t_9 · 0.0207 / √10).
    assert report.seeds_for(0.0207, 0.0149) == 10
    assert report.seeds_for(0.0207, 0.0147) == 11


def test_readme_ours_column_is_the_records(tables, records):
    # The README's ablation table sets our figure beside the paper's: each row's last cell must
    # be what v5_tables computes from the committed records (seeds 0-9, complete), and no row
    # may be missing.
    readme = open(os.path.join(HERE, "..", "..", "README.md")).read()
    table = readme[readme.index("### The paper's ablations"):]
    table = table[:table.index("\n\n", table.index("|"))]
    cells = tables.readme_cells(records)
    for override in ["(the default)"] + [f"`{row[2]}`" for row in tables.ROWS]:
        # a row may name more overrides today than the protocol did (the gated loss's span)
        line = next(ln for ln in table.splitlines() if f"| {override} " in ln)
        assert line.rstrip(" |").rsplit("| ", 1)[1] == cells[override.strip("`")], override


def test_every_run_of_the_protocol_is_recorded(tables, records):
    # The protocol planned GRPO and EviSD on seeds 0-29 and every row and dose on seeds 0-9;
    # each must have its record (config, metrics, held-out EM) committed.
    assert tables.missing(records) == []
    assert len(records) == 2 * len(tables.HEADLINE_SEEDS) + len(tables.ROWS) * len(tables.ROW_SEEDS)
