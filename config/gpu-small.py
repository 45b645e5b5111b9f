"""The embedded `small` model (~5M parameters, built offline) with a longer run, for one GPU: 1800
warm-up steps (fresh worlds, as measured), three times the RL steps and twice the questions per
step of the CPU default, and every held-out question in the evaluations. Learning rates stay
auto (the embedded model's, tuned on `tiny`). On one H200 (lab/results/gpu-check-h200.md) the
warm-up ran at 0.19-0.26 s per step and an RL step at 5.0 s: about 21-23 minutes for the whole
run, plus its evaluations; whether it learns more than `tiny` is not yet measured. For `base`,
add --MODEL=base.

    python train.py config/gpu-small.py --SEED=1
"""
MODEL = "small"
SFT_STEPS = 1800
# The default's 300 repeated-world steps were chosen on `tiny` at 750 steps.
SFT_REPEAT_STEPS = 0
SFT_BATCH = 32
RL_STEPS = 180
QUESTIONS_PER_STEP = 16
EVAL_EVERY = 30
EVAL_QUESTIONS = 200
OUT_DIR = "out/gpu-small"
