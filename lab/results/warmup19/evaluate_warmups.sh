#!/bin/bash
# The evaluations both issue-19 protocols run on the warm-ups in OUT (out/.../sft-*), each skipped
# when its output exists: greedy EM per hop on the validation worlds (where a recipe may be
# chosen) and on the held-out worlds (reported, never chosen on), 9 worlds each; then the habit
# shares of each warm-up on its own samples (evaluate.py --credit). VALIDATION_ONLY=1 stops after
# the validation worlds (to choose between recipes before spending the rest on the chosen one).
#   bash lab/results/warmup19/evaluate_warmups.sh OUT
set -u
cd "$(dirname "$0")/../../.."
OUT=$1
warmups=$(ls -d $OUT/sft-* | sort)
[ -e $OUT/warmups-validation.json ] || python evaluate.py $warmups --validation --json $OUT/warmups-validation.json \
  > $OUT/warmups-validation.log 2>&1
[ "${VALIDATION_ONLY:-0}" = 1 ] && exit 0
[ -e $OUT/warmups-heldout.json ] || python evaluate.py $warmups --json $OUT/warmups-heldout.json > $OUT/warmups-heldout.log 2>&1
for d in $warmups; do
  name=$(basename $d)
  [ -e $OUT/credit-$name.json ] || python evaluate.py $d --credit --json $OUT/credit-$name.json > $OUT/credit-$name.log 2>&1
done
