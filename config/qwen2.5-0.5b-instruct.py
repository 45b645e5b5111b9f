"""Qwen2.5-0.5B-Instruct on one GPU with Search-R1's recipe (arXiv 2503.09516): no warm-up,
GRPO/EviSD at LR 1e-6 with k3 KL 0.001, 5 samples per question at temperature 1.0, up to 500
new tokens per turn, top-3 passages, 4 turns. Tags stay text; rollouts stop at </search> and
</answer>. A starting point, not a tuned recipe: no run with the real weights has been recorded.
Measured on random weights of this shape (lab/gpu_check.py, docs/one-gpu.md): two updates at the
worst case (40 episodes of 2,570 tokens) peak at 25.3 GB with GRADIENT_CHECKPOINTING, and run
out of memory at 140 GB without it. On a 24 GB card, halve QUESTIONS_PER_STEP.

    python train.py config/qwen2.5-0.5b-instruct.py --SEED=1
    python train.py config/qwen2.5-0.5b-instruct.py --MODEL=/path/to/local/copy   # offline

The same recipe serves the other sizes: --MODEL=Qwen/Qwen2.5-1.5B-Instruct (measured at 58.6 GB
peak at the worst case: an 80 GB card) with --OUT_DIR=out/qwen2.5-1.5b-instruct.
"""
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
SFT_STEPS = 0                   # an instruct model follows the protocol from the instruction
LR = 1e-6
KL_COEF = 0.001
TEMPERATURE = 1.0
GROUP_SIZE = 5
QUESTIONS_PER_STEP = 8          # 40 episodes per update, scored in one forward
MAX_NEW_TOKENS = 500            # per turn
TOP_K = 3
MAX_TURNS = 4
RL_STEPS = 200
EVAL_EVERY = 25
EVAL_QUESTIONS = 100
GRADIENT_CHECKPOINTING = True
OUT_DIR = "out/qwen2.5-0.5b-instruct"
