"""curves.py: the learning-speed measures of benchmark v3, checked by hand, and the plot."""
import os

import pytest

from lab import curves


def test_running_mean_starts_at_the_first_step():
    assert (curves.running_mean([0.3, 0.1, 0.2, 0.0, 0.0], window=3)
            == pytest.approx([0.3, 0.2, 0.2, 0.1, 1 / 15]))
    assert curves.running_mean([], window=3) == []


def test_clear_step_is_the_first_running_share_below_the_line():
    shares = [0.20, 0.05, 0.01, 0.00, 0.03, 0.00, 0.00, 0.00]
    # running means over 3: .20 .125 .087 .02 .013 ...: step 4 is the first below 0.02 (0.02 is not)
    assert curves.clear_step(list(range(8)), shares, horizon=60, below=0.02, window=3) == 4
    assert curves.clear_step(list(range(8)), shares, horizon=60, below=0.02, window=1) == 2
    # steps with no search are missing: the step reported is the logged one
    assert curves.clear_step([0, 1, 5, 6], [0.2, 0.0, 0.0, 0.0], horizon=60, below=0.02,
                             window=3) == 6
    # never below: the horizon (censored)
    assert curves.clear_step([0, 1, 2], [0.5, 0.3, 0.1], horizon=60) == 60


def test_trapezoid_mean_by_hand():
    # 0 -> 0.4 over [0, 10], flat 0.4 over [10, 30]: area 2 + 8 = 10 over 30
    assert curves.trapezoid_mean([(30, 0.4), (0, 0.0), (10, 0.4)]) == pytest.approx(10 / 30)
    assert curves.trapezoid_mean([(0, 0.5)]) is None


def test_speed_from_metrics_rows():
    rows = [{"step": 0, "eval": True, "eval_macro": 0.2}]
    for step, (partial, premature) in enumerate([(0.3, 0.2), (0.1, None), (0.0, 0.0), (0.0, 0.0)]):
        rows.append({"step": step, "label_search_partial": partial,
                     "label_answer_premature": premature})
    rows.append({"step": 4, "eval": True, "eval_macro": 0.6})
    got = curves.speed(rows, rl_steps=4)
    assert set(got) == set(curves.SPEED_KEYS)
    # partial: running means .3 .2 .133 .033 -> never below 0.02 in 4 steps: censored at 4
    assert got["partial_clear"] == 4 and got["partial_area"] == pytest.approx(0.1)
    # premature: step 1 logged no answer; shares .2, 0, 0 at steps 0, 2, 3 -> .2 .1 .067: censored
    assert got["premature_clear"] == 4 and got["premature_area"] == pytest.approx(0.2 / 3)
    assert got["quick_area"] == pytest.approx(0.4)
    assert curves.speed([], rl_steps=4) == dict.fromkeys(curves.SPEED_KEYS)


def test_plot_curves_writes_a_png(tmp_path):
    metrics = {}
    rows = []
    for seed in (0, 1):
        for group in ("grpo", "evisd"):
            run = f"{group}-s{seed}"
            rows.append({"run": run, "group": group, "seed": seed})
            metrics[run] = ([{"step": s, "reward": 0.5, "label_search_partial": 0.2 / (s + 1),
                              "label_answer_premature": 0.1} for s in range(6)] +
                            [{"step": s, "eval": True, "eval_macro": 0.3 + s / 20}
                             for s in (0, 3, 6)])
    path = curves.plot_curves(rows, metrics, str(tmp_path / "c.png"))
    assert os.path.getsize(path) > 10_000
