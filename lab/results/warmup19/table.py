"""Issue 19's tables from the outputs of lab/results/warmup19/protocol.sh or protocol-repeat.sh (default: out/w19).

    python lab/results/warmup19/table.py [OUT] [--json lab/results/warmup19/recipe3.json]

Per seed 0-9: the warm-up's final loss (mean of its last 50 steps) and seconds, greedy EM on the
validation and the held-out worlds (1-hop and macro), the habit shares of its own samples
(partial-name searches among searches, premature answers among answers); then the default
run's wall time and the RL macro of seeds 0-4.
"""
import glob
import json
import os
import statistics
import sys

import torch

# Today's recipe before this change (900 steps, cosine, init 0.02, no context loss), held-out,
# on the numbered training worlds of before commit 1b9abb2 (lab/results/warmup-probes.md, "Before").
BEFORE = {"hop1": [0.573, 0.214, 0.158, 0.518, 0.334, 0.504, 0.509, 0.218, 0.424, 0.511],
          "macro": [0.309, 0.112, 0.079, 0.262, 0.182, 0.256, 0.257, 0.112, 0.245, 0.262]}


def by_run(path):
    """{run path: row} of an evaluate.py --json file."""
    return {r["run"]: r for r in json.load(open(path))["runs"]}


def main(argv):
    out = argv[0] if argv and not argv[0].startswith("--") else "out/w19"
    heldout = by_run(f"{out}/warmups-heldout.json")
    validation = by_run(f"{out}/warmups-validation.json") if os.path.exists(f"{out}/warmups-validation.json") else {}
    rows = []
    for path in sorted(glob.glob(f"{out}/sft-*")):
        state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
        seed, losses = state["config"]["SEED"], state["losses"]
        card = json.load(open(f"{out}/credit-{os.path.basename(path)}.json"))[path]["shares"]
        rows.append({"seed": seed, "final_loss": sum(losses[-50:]) / len(losses[-50:]), "warmup_s": state["seconds"],
                     "val_hop1": validation.get(path, {}).get("hop1"), "val_macro": validation.get(path, {}).get("macro"),
                     "hop1": heldout[path]["hop1"], "macro": heldout[path]["macro"],
                     "partial": card.get("label_search_partial", 0.0), "premature": card.get("label_answer_premature", 0.0),
                     "before_hop1": BEFORE["hop1"][seed] if seed < 10 else None,
                     "before_macro": BEFORE["macro"][seed] if seed < 10 else None})
    rows.sort(key=lambda r: r["seed"])
    cols = [("final loss", "final_loss"), ("warm-up s", "warmup_s")]
    cols += [("val 1-hop", "val_hop1"), ("val macro", "val_macro")] if validation else []
    cols += [("held-out 1-hop", "hop1"), ("held-out macro", "macro"), ("partial searches", "partial"),
             ("premature answers", "premature"), ("before: 1-hop", "before_hop1"), ("before: macro", "before_macro")]
    print("| seed | " + " | ".join(str(r["seed"]) for r in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for name, key in cols:
        spec = ".0f" if key == "warmup_s" else ".3f" if "hop1" in key or "macro" in key else ".2f"
        print(f"| {name} | " + " | ".join(format(r[key], spec) for r in rows) + " |")
    seconds = [r["warmup_s"] for r in rows]
    learned = [r["seed"] for r in rows if r["macro"] >= 0.25 and r["hop1"] >= 0.50]
    summary = {"warmup_s_min_median_max": [min(seconds), statistics.median(seconds), max(seconds)],
               "seeds_meeting_target": learned}
    if validation:   # what a recipe may be chosen on
        summary["seeds_meeting_target_on_validation"] = [
            r["seed"] for r in rows if r["val_macro"] >= 0.25 and r["val_hop1"] >= 0.50]
    walls = f"{out}/wall.jsonl"
    if os.path.exists(walls):
        # protocol.sh times the whole default run; protocol-repeat.sh its RL alone (the warm-up cached)
        for key in ("wall_s", "rl_wall_s"):
            times = {r["seed"]: r[key] for r in map(json.loads, open(walls)) if key in r}
            if times:
                summary["default_run_" + key] = times
    if os.path.exists(f"{out}/rl-heldout.json"):
        rl = {r["seed"]: r["macro"] for r in json.load(open(f"{out}/rl-heldout.json"))["runs"]}
        summary["rl_macro"] = rl
        summary["rl_macro_mean"] = sum(rl.values()) / len(rl)
    print(json.dumps(summary, indent=1))
    if "--json" in argv:
        with open(argv[argv.index("--json") + 1], "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
