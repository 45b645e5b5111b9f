"""Qwen2.5-7B-Instruct on one GPU through LoRA: the 3B preset's recipe (the EviSD paper's,
scaled to one GPU; its learning rate cited there), given after it, at 7B:

    python train.py config/qwen2.5-3b-instruct-lora.py config/qwen2.5-7b-instruct-lora.py

Four questions per step (32 episodes) instead of five, so that the worst case fits an 80 GB
card (docs/one-gpu.md). The paper trains its 3B and 7B backbones at one learning rate, so the
rate stays. Alone this file still trains a LoRA adapter from the instruct model, but at the
defaults' other settings: give it after the 3B preset.

No run with the real weights is recorded here (the GPU machines here cannot download them):
this is a starting point, not a tuned recipe.
"""
MODEL = "Qwen/Qwen2.5-7B-Instruct"
QUESTIONS_PER_STEP = 4          # 32 episodes per update
LORA_RANK = 16                  # never full fine-tuning: float32 weights + AdamW = 122 GB
SFT_STEPS = 0                   # never a full fine-tuning warm-up either
OUT_DIR = "out/qwen2.5-7b-instruct-lora"
