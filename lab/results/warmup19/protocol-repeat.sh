#!/bin/bash
# Issue 19, session 5: ten warm-ups of a recipe given as train.py overrides (ARGS), fixed before it
# ran, then the RL of seeds 0-4 on them. One job at a time on the 2 cores; resumable (a step whose
# output exists is skipped). Warm-ups first, so the ten-seed table comes before the RL runs:
#   1. the warm-up alone, seeds 0-9 (RL_STEPS=0); its seconds are in the log and state.pt;
#   2. greedy EM per hop on the validation worlds (where a recipe may be chosen) and on the
#      held-out worlds (reported, never chosen on), 9 worlds each;
#   3. the habit shares of each warm-up on its own samples (evaluate.py --credit);
#   4. the default run's RL, seeds 0-4 (the warm-up cached), wall time; 5. their held-out EM.
#   ARGS="--SFT_STEPS=450 --SFT_REPEAT_STEPS=300" OUT=out/w19rep bash lab/results/warmup19/protocol-repeat.sh
# VALIDATION_ONLY=1 stops after the validation EM of step 2; run again without it to finish.
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-out/w19rep}
ARGS=${ARGS:-}
mkdir -p $OUT
for s in 0 1 2 3 4 5 6 7 8 9; do
  [ -e $OUT/warmup-s$s/ckpt-000000 ] && continue
  python train.py --SEED=$s $ARGS --RL_STEPS=0 --EVAL_EVERY=0 --OUT_DIR=$OUT/warmup-s$s --SFT_DIR=$OUT/sft \
    --overwrite > $OUT/warmup-s$s.log 2>&1 || exit 1
done
bash lab/results/warmup19/evaluate_warmups.sh $OUT || exit 1
[ "${VALIDATION_ONLY:-0}" = 1 ] && { echo "validation done"; exit 0; }
for s in 0 1 2 3 4; do
  [ -e $OUT/evisd-s$s/ckpt-000060 ] && continue
  start=$(date +%s.%N)
  python train.py --SEED=$s $ARGS --OUT_DIR=$OUT/evisd-s$s --SFT_DIR=$OUT/sft --overwrite > $OUT/evisd-s$s.log 2>&1 || exit 1
  echo "{\"seed\": $s, \"rl_wall_s\": $(python -c "print(round($(date +%s.%N) - $start, 1))")}" >> $OUT/wall.jsonl
done
[ -e $OUT/rl-heldout.json ] || python evaluate.py $OUT/evisd-s0 $OUT/evisd-s1 $OUT/evisd-s2 $OUT/evisd-s3 $OUT/evisd-s4 \
  --json $OUT/rl-heldout.json > $OUT/rl-heldout.log 2>&1
echo done
