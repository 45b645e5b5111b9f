#!/bin/bash
# Issue 19's measurement of the warm-up recipe that train.py's defaults hold at this commit,
# fixed before it ran. One job at a time on the 2 cores, so the seconds are quiet-core seconds.
# Resumable: a step whose output exists is skipped.
#   1. the default run, `python train.py --SEED=s`, seeds 0-4: warm-up + 60 EviSD steps, wall time;
#   2. the warm-up alone, seeds 5-9 (RL_STEPS=0);
#   3. greedy EM per hop of the ten warm-ups on the validation worlds (where a recipe may be
#      chosen) and on the held-out worlds (reported, never chosen on), 9 worlds each;
#   4. the habit shares of each warm-up on its own samples (evaluate.py --credit: held-out questions);
#   5. held-out EM of the five RL runs.
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-out/w19}
mkdir -p $OUT
for s in 0 1 2 3 4; do
  [ -e $OUT/evisd-s$s/ckpt-000060 ] && continue
  start=$(date +%s.%N)
  python train.py --SEED=$s --OUT_DIR=$OUT/evisd-s$s --SFT_DIR=$OUT/sft --overwrite > $OUT/evisd-s$s.log 2>&1 || exit 1
  echo "{\"seed\": $s, \"wall_s\": $(python -c "print(round($(date +%s.%N) - $start, 1))")}" >> $OUT/wall.jsonl
done
for s in 5 6 7 8 9; do
  [ -e $OUT/warmup-s$s/ckpt-000000 ] && continue
  python train.py --SEED=$s --RL_STEPS=0 --EVAL_EVERY=0 --OUT_DIR=$OUT/warmup-s$s --SFT_DIR=$OUT/sft --overwrite \
    > $OUT/warmup-s$s.log 2>&1 || exit 1
done
bash lab/results/warmup19/evaluate_warmups.sh $OUT || exit 1
[ -e $OUT/rl-heldout.json ] || python evaluate.py $OUT/evisd-s0 $OUT/evisd-s1 $OUT/evisd-s2 $OUT/evisd-s3 $OUT/evisd-s4 \
  --json $OUT/rl-heldout.json > $OUT/rl-heldout.log 2>&1
echo done
