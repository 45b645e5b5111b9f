#!/bin/bash
# LoRA against full fine-tuning on the embedded model (issue 54), as run on 2026-12-07 on 2 CPU
# cores (torch 2.13.0, transformers 5.25.0, peft 0.21.2). Fixed before any comparison:
#   - the default run (EviSD, 60 RL steps) from each seed's default warm-up, seeds 0-2;
#   - LoRA: rank 16, alpha 32, on every attention and MLP projection;
#   - LoRA's LR chosen on seed 0's run, scored on 3 validation worlds (evaluate.py --validation),
#     over 3x, 10x and 30x full fine-tuning's 2e-4 (LoRA Without Regret's rule is about 10x);
#     the best was the grid's lowest point, so 1x (2e-4) was added, still before any held-out
#     look; ties go to the smaller rate;
#   - held-out: evaluate.py's 9 held-out worlds, macro EM, LoRA − full paired by seed.
# Then the CPU's peak memory of one EviSD update (lab/gpu_memory.py --dry: the Qwen preset's
# update on a small batch), full fine-tuning with its reference against LoRA r16.
set -euo pipefail
E=out/lora-exp
for s in 0 1 2; do
  python train.py --SEED=$s --SFT_DIR=out/sft --OUT_DIR=$E/full-s$s --overwrite
done
for lr in 0.0006 0.002 0.006 0.0002; do
  python train.py --SEED=0 --LORA_RANK=16 --LR=$lr --SFT_DIR=out/sft --OUT_DIR=$E/sweep-lr$lr-s0 \
    --overwrite
  python evaluate.py $E/sweep-lr$lr-s0 --validation --worlds 3 --json $E/sweep-lr$lr-val.json
done
# the validation's choice: the best macro, ties to the smaller rate
LR=$(python -c "
import json
scores = {lr: json.load(open(f'$E/sweep-lr{lr}-val.json'))['runs'][0]['macro']
          for lr in ('0.0002', '0.0006', '0.002', '0.006')}
print(min((lr for lr, s in scores.items() if s == max(scores.values())), key=float))")
mkdir -p $E/paired
ln -sfn ../sweep-lr$LR-s0 $E/paired/lora-s0
for s in 0 1 2; do ln -sfn ../full-s$s $E/paired/full-s$s; done
for s in 1 2; do
  python train.py --SEED=$s --LORA_RANK=16 --LR=$LR --SFT_DIR=out/sft --OUT_DIR=$E/paired/lora-s$s \
    --overwrite
done
python evaluate.py $E/paired/{full,lora}-s{0,1,2} --baseline full --json $E/heldout.json
for spec in "qwen2.5-0.5b 8" "qwen2.5-0.5b 16" "qwen2.5-0.5b 24" "qwen2.5-1.5b 12"; do
  set -- $spec
  for r in 0 16; do
    python lab/gpu_memory.py $1 --dry --layers $2 --lora $r --updates 1 --json $E/mem/$1-l$2-r$r.json
  done
done
