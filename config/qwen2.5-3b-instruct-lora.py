"""Qwen2.5-3B-Instruct on one GPU through LoRA: the EviSD paper's recipe for its 3B backbone
(arXiv 2608.01359, on Search-R1's: RL straight from the instruct model, k3 KL 0.001, clip 0.2,
8 rollouts per question at temperature 1.0, top-3 passages, 4 turns, 300 steps), scaled to one
GPU: 5 questions per step instead of 128, and a rank-16 LoRA adapter instead of full
fine-tuning, so the policy, EviSD's teacher and the KL's reference share one bf16 copy of the
base weights. The learning rate is ten times the paper's full fine-tuning 1e-6: "LoRA Without
Regret" (Schulman et al., Thinking Machines, 2025) found LoRA's best rate about 10x full
fine-tuning's, in RL too, with alpha fixed at 32 whatever the rank.

No run with the real weights is recorded here (the GPU machines here cannot download them):
this is a starting point, not a tuned recipe. Memory: docs/one-gpu.md predicts the peak at the
worst case, and `python lab/gpu_check.py` measures a LoRA update at this shape on a GPU.

    python train.py config/qwen2.5-3b-instruct-lora.py --SEED=0
    python evaluate.py out/qwen2.5-3b-instruct-lora                 # the adapter on its base
    python lab/export.py out/qwen2.5-3b-instruct-lora out/qwen2.5-3b-merged   # one HF directory
"""
MODEL = "Qwen/Qwen2.5-3B-Instruct"
LORA_RANK = 16                  # RL needs little capacity: rank 1 matched full fine-tuning there
LORA_ALPHA = 32.0
LR = 1e-5                       # 10 x the paper's 1e-6 (LoRA Without Regret)
SFT_STEPS = 0                   # the paper starts RL from the instruct model
KL_COEF = 0.001                 # the paper's, as Search-R1's
TEMPERATURE = 1.0               # Search-R1's rollouts
GROUP_SIZE = 8                  # the paper's rollouts per question
QUESTIONS_PER_STEP = 5          # the paper's 128, scaled to one GPU: 40 episodes per update
MAX_NEW_TOKENS = 500            # per turn, as Search-R1
RL_STEPS = 300                  # the paper's
EVAL_EVERY = 50
EVAL_QUESTIONS = 200
GRADIENT_CHECKPOINTING = True   # recompute activations: without it, 0.5B's worst case overflowed
OUT_DIR = "out/qwen2.5-3b-instruct-lora"
