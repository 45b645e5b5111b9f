"""Qwen2.5-1.5B-Instruct on one 80 GB GPU, the same recipe as config/qwen2.5-0.5b-instruct.py
(Search-R1's settings). Two updates of a random model of this shape at the worst case peak
at 58.6 GB (README, One GPU). A starting point, not a tuned recipe: no run with the real
weights has been recorded.

    python train.py config/qwen2.5-1.5b-instruct.py --SEED=1
"""
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
SFT_STEPS = 0
LR = 1e-6
KL_COEF = 0.001
TEMPERATURE = 1.0
GROUP_SIZE = 5
QUESTIONS_PER_STEP = 8
MAX_NEW_TOKENS = 500
TOP_K = 3
MAX_TURNS = 4
RL_STEPS = 200
EVAL_EVERY = 25
EVAL_QUESTIONS = 100
GRADIENT_CHECKPOINTING = True
OUT_DIR = "out/qwen2.5-1.5b-instruct"
