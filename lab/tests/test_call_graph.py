"""lab/call_graph.py on one RL step: a newcomer follows it in one sitting, so the step reaches at
most 40 named project functions, all in core files (the top level), traced as the issue that set
the bound traced it; with a policy that writes real searches and answers (the rollout's action
ranges, the env's searches and EviSD's teacher all run) it reaches no more than it did when
that bound was set."""
import copy

import torch

import train
from lab import call_graph

MOST = 40         # a random model, no warm-up: python lab/call_graph.py with the flags below
MOST_WARM = 49    # a model that searches and answers (2026-12-06; 2026-12-07: +update_begins)


def check(found, most):
    listing = "\n".join(f"{path}:{name}" for path, _, name in sorted(found))
    assert all("/" not in path for path, _, _ in found), listing        # core files only
    assert len(found) <= most, listing


def test_one_step_reaches_at_most_40_core_functions(tmp_path):
    found = call_graph.trace(lambda: train.main([
        "--SFT_STEPS=0", "--RL_STEPS=2", "--QUESTIONS_PER_STEP=2", "--GROUP_SIZE=2",
        "--MAX_NEW_TOKENS=16", "--WORLD_SCALE=0.3", "--EVAL_EVERY=0", "--DEVICE=cpu",
        f"--OUT_DIR={tmp_path}/run", f"--SFT_DIR={tmp_path}/sft"]))
    assert {"rollout", "credit", "group_advantages", "policy_loss"} <= {n for _, _, n in found}
    check(found, MOST)


def test_a_step_that_searches_and_scores_stays_as_short(tok, trained, world):
    cfg = train.configure(["--QUESTIONS_PER_STEP=3", "--GROUP_SIZE=4", "--MAX_NEW_TOKENS=24",
                           "--TEMPERATURE=1.0", "--DEVICE=cpu"])[0]
    policy = copy.deepcopy(trained)
    reference = copy.deepcopy(trained).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg["LR"])
    records = []
    for step in range(4):    # until a batch has mixed rewards, so that the teacher scores
        found = call_graph.trace(lambda: records.append(
            train.rl_step(cfg, step, world, policy, reference, tok, optimizer)[1]))
        if (records[-1]["adv"] != 0).any():
            break
    r = records[-1]["rollouts"]
    assert any(s.kind == "search" for spans in r.spans for s in spans)
    assert (records[-1]["gap"] != 0).any()                    # the teacher ran
    assert {"rollout", "action_ranges", "step", "credit", "teacher_logprobs",
            "evisd_correction", "policy_loss"} <= {n for _, _, n in found}
    check(found, MOST_WARM)
