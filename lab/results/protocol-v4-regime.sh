#!/bin/bash
# Benchmark v4, part 1 (issue 37): choosing a credit-hard toy regime with GRPO ONLY.
# Written and committed before any of its runs; no other method runs on a candidate before the
# choice below is made and written into lab/results/protocol-v4.md. Run from the repository root:
#   nohup bash lab/results/protocol-v4-regime.sh > out/v4/regime.log 2>&1 &
# Restartable: a finished run (ckpt-000060) is skipped, an interrupted one resumes.
#
# Why: on the default toy (benchmark v3) GRPO clears both habits in 4-7 steps and EviSD - GRPO is
# +0.004 [-0.009, +0.017]: outcome credit is not the bottleneck there. The candidates make the two
# habits the warm-up teaches (answering one hop early; searching a person by first name only)
# stronger, so fewer groups hold a success to contrast with, and the wrong action more often sits
# inside an episode whose other actions are right.
#   R1  SFT_STOP_EARLY=0.8  SFT_PARTIAL_NAME=0.8
#   R2  SFT_STOP_EARLY=0.8  SFT_PARTIAL_NAME=0.8  GROUP_SIZE=4 QUESTIONS_PER_STEP=16 (same
#       episodes per step, more groups that tie)
#   R3  SFT_STOP_EARLY=0.95 SFT_PARTIAL_NAME=0.95
# Everything else is train.py's default (tiny model, 750 warm-up steps, 60 RL steps of 64
# episodes). Probe seeds 900 and 901, which no later comparison uses. EVAL_EVERY=0: the runs
# never look at a held-out world.
#
# Measures, GRPO only:
#   clear step of each habit, from the training batches' oracle label shares (metrics.jsonl,
#     as in v3): the first step whose 3-step running share of label_answer_premature (among
#     answers) or label_search_partial (among searches) is below 0.02; 60 if never.
#   validation EM at step 60: evaluate.py --validation --worlds 3 (validation worlds only),
#     1-hop, 2-hop, macro. The scripted expert without habits scores 1.0 on every question.
# Decision rule (fixed now): a candidate is credit-hard if, on both probe seeds, some habit's
# clear step is >= 30 AND the validation 2-hop EM at step 60 is <= 0.80. The regime is the first
# credit-hard candidate in the order R1, R2, R3 (the mildest first: a regime where nothing learns
# leaves no room for any rule). If none qualifies, the candidate with the largest mean clear step
# is used and the protocol says that the criterion was not met.
set -euo pipefail
V=out/v4
mkdir -p $V

probe() {   # name seed overrides...
  local name=$1 seed=$2; shift 2
  local run=$V/probe-$name-s$seed
  if [ ! -d "$run/ckpt-000060" ]; then
    echo "$(date +%T) $name seed $seed"
    python train.py --METHOD=grpo --SEED="$seed" --SFT_DIR=$V/sft --OUT_DIR="$run" --EVAL_EVERY=0 \
      --resume "$@" > "$V/log-probe-$name-s$seed.txt" 2>&1
  fi
  if [ ! -f "$run/validation.json" ]; then
    python evaluate.py "$run" --validation --worlds 3 --json "$run/validation.json" \
      > /dev/null 2>> "$V/log-probe-$name-s$seed.txt"
  fi
}

for s in 900 901; do
  probe R1 $s --SFT_STOP_EARLY=0.8 --SFT_PARTIAL_NAME=0.8
  probe R2 $s --SFT_STOP_EARLY=0.8 --SFT_PARTIAL_NAME=0.8 --GROUP_SIZE=4 --QUESTIONS_PER_STEP=16
  probe R3 $s --SFT_STOP_EARLY=0.95 --SFT_PARTIAL_NAME=0.95
done
echo "$(date +%T) done"
