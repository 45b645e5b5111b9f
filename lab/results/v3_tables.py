"""Benchmark v3's tables (lab/results/results-v3.md) from the protocol's outputs
(lab/results/protocol-v3.sh).

    python lab/results/v3_tables.py [lab/results/results-v3.json] [out/v3]

Per seed: the warm-up's held-out macro, each method's EM and learning-speed measures, and each
run's wall time (warm-up, the 60 RL steps alone, and the whole run from its start in the
protocol's log to its last log write, held-out evaluation included); then the dose-response
over eps on the seeds that have it. Reads lab/report.py's --json output; trains nothing.
"""
import datetime
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from lab import curves, report  # noqa: E402


def wall_times(out):
    """{run dir name: (warm-up s or None, whole run s)} from protocol.log's start lines and each
    run's log: its tqdm warm-up line, and its modification time (the evaluation's last write)."""
    times = {}
    for line in open(os.path.join(out, "protocol.log")):
        m = re.match(r"(\d\d:\d\d:\d\d) (\S+) seed (\d+)$", line.strip())
        if not m:
            continue
        name = f"{m[2]}-s{m[3]}"
        log = os.path.join(out, f"log-{name}.txt")
        day = datetime.date.fromtimestamp(os.path.getmtime(log))
        start = datetime.datetime.combine(day, datetime.time.fromisoformat(m[1]))
        text = open(log, errors="replace").read()
        warm = re.findall(r"warm-up: 100%\|[^|]*\| \d+/\d+ \[(\d+):(\d+)<", text)
        times[name] = (int(warm[-1][0]) * 60 + int(warm[-1][1]) if warm else None,
                       os.path.getmtime(log) - start.timestamp())
    return times


def fmt(v, spec=".3f"):
    return "–" if v is None else format(v, spec)


def per_seed_table(rows, times):
    by = {(r["group"], r["seed"]): r for r in rows}
    seeds = sorted({s for g, s in by if g == "grpo"})
    cols = ["macro", "hop1", "hop2"] + list(curves.SPEED_KEYS)
    head = ("| seed | warm-up macro | " + " | ".join(f"{c} G / E" for c in cols)
            + " | run s G / E (warm-up s) |")
    lines = [head, "|---" * (len(cols) + 3) + "|"]
    spec = {c: ".3g" if "clear" in c else ".3f" for c in cols}   # clear steps are whole numbers
    for s in seeds:
        g, e = by[("grpo", s)], by.get(("evisd", s))
        if e is None:
            continue
        cells = [f"{fmt(g[c], spec[c])} / {fmt(e[c], spec[c])}" for c in cols]
        tg, te = times.get(f"grpo-s{s}", (None, None)), times.get(f"evisd-s{s}", (None, None))
        lines.append(f"| {s} | {fmt(g['warmup_macro'])} | " + " | ".join(cells) +
                     f" | {fmt(tg[1], '.0f')} / {fmt(te[1], '.0f')} ({fmt(tg[0], '.0f')}) |")
    return "\n".join(lines)


def dose_table(rows, paired):
    """The paired differences from GRPO of each EviSD group, over the seeds the eps runs share."""
    groups = [g for g in ("evisd", "evisd-eps0.5", "evisd-eps1.0") if g in paired]
    seeds = sorted(set.intersection(*(set(paired[g]["seeds"]) for g in groups)))
    # The eps runs cover only some seeds: every group is paired on those alone.
    shared = report.paired_differences([r for r in rows if r["seed"] in seeds])
    lines = [f"| measure (− GRPO, seeds {', '.join(map(str, seeds))}) | "
             + " | ".join(groups) + " |",
             "|---" * (len(groups) + 1) + "|"]
    for k in report.PAIRED_KEYS:
        cells = [report.fmt_interval(*shared[g]["intervals"][k])
                 if k in shared[g]["intervals"] else "–" for g in groups]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv):
    path = argv[0] if argv else "lab/results/results-v3.json"
    out = argv[1] if len(argv) > 1 else "out/v3"
    got = json.load(open(path))
    rows, paired = got["runs"], got["paired"]
    times = wall_times(out) if os.path.exists(os.path.join(out, "protocol.log")) else {}
    print(report.summary_table(rows, {g: p for g, p in paired.items() if g == "evisd"}), "",
          per_seed_table(rows, times), "", dose_table(rows, paired), sep="\n")
    for g, p in paired.items():   # the spread that sets the power: seeds for a half-width of 0.008
        diffs = [d["macro"] for d in p["diff"].values() if d["macro"] is not None]
        if len(diffs) > 1:
            sd = statistics.stdev(diffs)
            need = report.seeds_for(sd, 0.008)
            print(f"{g} − GRPO: {len(diffs)} seeds, sd of paired macro differences {sd:.4f}, "
                  f"half-width {(p['macro'][2] - p['macro'][1]) / 2:.4f}; "
                  f"seeds for half-width 0.008: {need}")
    rest = [t[1] for t in times.values()]
    if rest:
        print(f"\nwhole runs: {min(rest):.0f}-{max(rest):.0f} s, total {sum(rest) / 60:.1f} min")


if __name__ == "__main__":
    main(sys.argv[1:])
