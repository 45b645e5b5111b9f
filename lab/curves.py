"""Learning speed from a run's metrics.jsonl, and the plot of its curves.

Both methods end with the habits gone, so final EM cannot see what EviSD's sharper credit should
buy: *how fast* a habit goes. With MEASURE=True every training step logs the oracle's label
shares of its batch (lab/measure.py, lab/oracle.py), so speed costs no extra rollout. For each
habit (partial-name searches, premature answers):

    clear step  the first step whose running share (the mean of the last WINDOW steps' shares)
                is below CLEAR_BELOW; RL_STEPS if it never is (censored);
    area        the mean share over the run's steps (the area under the curve / steps): it
                counts how much of the habit is left, and for how long.

and for the held-out quick check (train.py's EVAL_EVERY): the area under its macro-EM curve over
the run, divided by the run's length. Definitions fixed in lab/results/protocol-v3.sh before its
runs. lab/report.py reads it with --speed and --plot.
"""
import os

# label key in metrics.jsonl -> short name
HABITS = {"label_search_partial": "partial", "label_answer_premature": "premature"}
CLEAR_BELOW = 0.02   # 2% of searches (of answers): about 2 of a batch's ~100 searches
WINDOW = 3           # steps; short, since both habits are gone within ~15 steps
LEGEND_MAX_RUNS = 24   # a legend entry per run up to this many runs
SPEED_KEYS = tuple(f"{h}_{m}" for h in HABITS.values() for m in ("clear", "area")) + ("quick_area",)


def running_mean(values, window=WINDOW):
    """Trailing mean over the last ``window`` values, the first ones over what there is so far:
    the curve starts at step 0 (a centred or full-window mean would hide the first steps)."""
    return [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1])
            for i in range(len(values))]


def clear_step(steps, shares, horizon, below=CLEAR_BELOW, window=WINDOW):
    """The first of ``steps`` at which the running share of ``shares`` is below ``below``;
    ``horizon`` (the run's RL_STEPS) when it never is."""
    for step, share in zip(steps, running_mean(shares, window)):
        if share < below:
            return step
    return horizon


def trapezoid_mean(points):
    """The area under a piecewise-linear curve through (x, y) points, divided by its x range."""
    points = sorted(points)
    if len(points) < 2 or points[-1][0] == points[0][0]:
        return None
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def speed(metrics, rl_steps):
    """The learning-speed measures of one run from its metrics rows (runs.read_metrics): a dict
    with SPEED_KEYS (None where the run logged nothing to measure, e.g. real data)."""
    train = sorted((m for m in metrics if not m.get("eval")), key=lambda m: m["step"])
    out = {}
    for key, name in HABITS.items():
        # None: no search that step
        pts = [(m["step"], m[key]) for m in train if m.get(key) is not None]
        steps, shares = [p[0] for p in pts], [p[1] for p in pts]
        out[f"{name}_clear"] = clear_step(steps, shares, rl_steps) if pts else None
        out[f"{name}_area"] = sum(shares) / len(shares) if pts else None
    out["quick_area"] = trapezoid_mean([(m["step"], m["eval_macro"]) for m in metrics
                                        if m.get("eval") and m.get("eval_macro") is not None])
    return out


def pyplot():
    """matplotlib's pyplot, drawing to files; where matplotlib is missing, one line saying so (it
    is the lab's, for pictures, and not among the core's packages)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("a plot needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_curves(rows, metrics, path):
    """Learning curves of evaluated runs: ``rows`` are evaluate.run_summary's (run, group, seed)
    and ``metrics`` maps each run to its metrics rows. Top: every run, one colour per seed and
    one line style per method, so a seed's pair reads at a glance; bottom: each method's mean
    over the seeds every method has. Shares are running means over WINDOW steps from step 0."""
    plt = pyplot()
    panels = [("label_search_partial", "partial-name searches (share of searches)"),
              ("label_answer_premature", "premature answers (share of answers)"),
              ("eval_macro", "held-out quick check (macro EM)"), ("reward", "sampled train reward")]
    groups = list(dict.fromkeys(r["group"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    # The means compare methods on the same seeds only: those every group has.
    shared = set.intersection(*({r["seed"] for r in rows if r["group"] == g} for g in groups))
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(2, len(panels), figsize=(5 * len(panels), 8), sharex=True)
    by_group = {g: {p[0]: [] for p in panels} for g in groups}
    for r in rows:
        i = seeds.index(r["seed"])
        # the 10 dark hues first, then the light ones
        colour = plt.cm.tab20((2 * i + 2 * i // 20) % 20)
        style = styles[groups.index(r["group"]) % len(styles)]
        for ax, (key, title) in zip(axes[0], panels):
            evals = key.startswith("eval")
            pts = [(m["step"], m[key]) for m in metrics[r["run"]]
                   if bool(m.get("eval")) == evals and m.get(key) is not None]
            if not pts:
                continue
            xs, ys = zip(*sorted(pts))
            ys = ys if evals else running_mean(list(ys))
            ax.plot(xs, ys, style, color=colour, lw=1.2, marker="o" if evals else None, ms=3,
                    label=f"{r['group']} s{r['seed']}")
            if r["seed"] in shared:
                by_group[r["group"]][key].append(dict(zip(xs, ys)))
            ax.set_title(title, fontsize=10)
    for ax, (key, title) in zip(axes[1], panels):
        for g in groups:
            curves = by_group[g][key]
            xs = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if xs:
                # a hue per method too: beyond four methods the line styles repeat
                ax.plot(xs, [sum(c[x] for c in curves) / len(curves) for x in xs],
                        styles[groups.index(g) % len(styles)],
                        color=plt.cm.tab10(groups.index(g) % 10), lw=1.6, label=g)
        ax.set_title(f"mean of the {len(shared)} seeds all share: {title}", fontsize=9)
        ax.set_xlabel("RL step")
        if ax.lines:
            ax.legend(fontsize=7)
    # A legend of every run fits up to a few dozen; beyond, it would cover the panels.
    if len(rows) <= LEGEND_MAX_RUNS:
        axes[0][-1].legend(fontsize=6, ncol=2)
    else:
        axes[0][0].text(0.0, 1.12, f"{len(rows)} runs: colour = seed, line style = method",
                        transform=axes[0][0].transAxes, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.path.abspath(path)
