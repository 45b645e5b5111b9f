#!/bin/bash
# The benchmark-v2 protocol of lab/results/results-v2.md, fixed before EviSD - GRPO was looked at.
# Run from the repository root: bash lab/results/protocol.sh. Every run logs to out/v2/log-<run>-s<seed>.txt;
# a finished run (its final checkpoint is there) is skipped, so the script can be restarted.
# Seeds 0-2 run GRPO, EviSD and the two ablations; seeds 3-5 GRPO and EviSD.
set -euo pipefail
V=out/v2
ABLATION_NAMES="evisd-firstbefore evisd-eps0.5"
declare -A ABLATIONS=(
  [evisd-firstbefore]="--EVIDENCE_AT=first --ANSWER_AT=tag"   # the placement before this benchmark
  [evisd-eps0.5]="--EVISD_EPS=0.5"
)

train() {   # name seed overrides...
  local name=$1 seed=$2; shift 2
  if [ -d "$V/$name-s$seed/ckpt-000060" ]; then return; fi
  python train.py --SEED="$seed" --SFT_DIR=$V/sft --OUT_DIR="$V/$name-s$seed" --resume "$@" \
    > "$V/log-$name-s$seed.txt" 2>&1
  python evaluate.py "$V/$name-s$seed" > /dev/null 2>> "$V/log-$name-s$seed.txt"   # caches its held-out EM
}

for s in 0 1 2 3 4 5; do
  train grpo "$s" --METHOD=grpo
  train evisd "$s" --METHOD=evisd
  if [ "$s" -le 2 ]; then
    for name in $ABLATION_NAMES; do train "$name" "$s" --METHOD=evisd ${ABLATIONS[$name]}; done
  fi
done
runs=$(for s in 0 1 2 3 4 5; do echo $V/grpo-s$s $V/evisd-s$s; done
       for s in 0 1 2; do for n in $ABLATION_NAMES; do echo $V/$n-s$s; done; done)
python evaluate.py $runs --json lab/results/results-v2.json > $V/results.txt 2>&1
