#!/bin/bash
# Benchmark v4, part 2 (issue 37): every credit rule against GRPO, paired, in the credit-hard
# regime. Written and committed before any run of it, and before part 1
# (protocol-v4-regime.sh, GRPO only) has chosen the regime; the one line REGIME below is filled
# in, in its own commit, once part 1's decision rule has chosen, and before any method but GRPO
# runs on it. Run from the repository root, the runs as two shards of one thread each (two
# processes of two threads on two shared cores spin and crawl), then the report:
#   OMP_NUM_THREADS=1 nohup bash lab/results/protocol-v4.sh runs 0 2 > out/v4/shard0.log 2>&1 &
#   OMP_NUM_THREADS=1 nohup bash lab/results/protocol-v4.sh runs 1 2 > out/v4/shard1.log 2>&1 &
#   bash lab/results/protocol-v4.sh report          # once both shards are done
# Shard k of n plays the seeds s with s % n == k. Restartable: a finished run (its ckpt-000060
# and held-out EM) is skipped, an interrupted one continues with --resume; each run logs to
# out/v4/log-<method>-s<seed>.txt.
#
# Runs, all with the regime's overrides and train.py's defaults otherwise (tiny model with the
# previous-token head, 750 warm-up steps, 60 RL steps of 8 questions x 8 samples, EVAL_EVERY=10):
#   seeds 0-9:   grpo, evisd (the paper's rule, the default), rlsd, opsd, sdar, sd_search, bicaa
#                (lab/peers.py, their defaults), seed by seed in that order;
#   seeds 10-29: grpo and evisd only.
#   All runs of a seed share its warm-up (cached) and its step-0 batch (runs.seed_everything).
# Then the report card of every rule (evaluate.py --credit --rules) on validation questions, on
# the warm-up of seed 0, in the default toy and in the regime.
#
# Measures, paired by seed (method minus GRPO): mean difference and 95% t-interval over seeds.
#   primary  held-out macro EM (mean of 1- and 2-hop) of the final checkpoint, greedy, over
#            EVAL_WORLDS_V4 = 18 held-out worlds (~2,180 test questions; v3 used 9: doubling
#            them halves the evaluation's share of the paired variance).
#   also     1-hop, 2-hop and 3-hop EM; learning speed as in v3 (evaluate.py --speed: clear step
#            and area of label_search_partial and label_answer_premature, the quick check's area).
# Power: v3's paired macro sd was 0.0207; with 30 seeds the half-width is
#   t_29 * 0.0207 / sqrt(30) = 0.0077 <= 0.008. The sd is re-estimated and reported; no seeds are
#   added after looking. The peers get 10 seeds (half-width ~0.015 at v3's sd).
# Decision rule (EviSD - GRPO, primary, 30 seeds):
#   lower bound > 0          -> EviSD's rule helps in this regime (and whether the paper's
#                               +0.013 lies inside is said);
#   upper bound < 0          -> it hurts;
#   otherwise                -> no difference detected, with the half-width reached.
# Each peer (10 seeds) is read the same way against GRPO, and against EviSD on the same seeds.
# Budget: ~6.5 hours of the 2 cores (v3: ~3 min per run with its evaluation; sd_search and bicaa
# cost more per step).
set -euo pipefail
V=out/v4
EVAL_WORLDS_V4=18
REGIME="--SFT_STOP_EARLY=0.95 --SFT_PARTIAL_NAME=0.95"   # part 1 chose R3: regime-v4.md
if [ -z "$REGIME" ]; then
  echo "the regime is not chosen yet: run lab/results/protocol-v4-regime.sh first" >&2
  exit 1
fi
mkdir -p $V

train() {   # method seed
  local method=$1 seed=$2
  local run=$V/$method-s$seed
  if [ ! -d "$run/ckpt-000060" ]; then
    echo "$(date +%T) $method seed $seed"
    # shellcheck disable=SC2086
    python train.py --METHOD="$method" --SEED="$seed" --SFT_DIR=$V/sft --OUT_DIR="$run" \
      --EVAL_EVERY=10 --resume $REGIME > "$V/log-$method-s$seed.txt" 2>&1
  fi
  python evaluate.py "$run" --worlds $EVAL_WORLDS_V4 > /dev/null 2>> "$V/log-$method-s$seed.txt"
}

if [ "${1:-}" = runs ]; then
  shard=${2:-0} shards=${3:-1}
  for s in 0 1 2 3 4 5 6 7 8 9; do
    if [ $((s % shards)) -ne "$shard" ]; then continue; fi
    for m in grpo evisd rlsd opsd sdar sd_search bicaa; do train $m "$s"; done
  done
  for s in $(seq 10 29); do
    if [ $((s % shards)) -ne "$shard" ]; then continue; fi
    for m in grpo evisd; do train $m "$s"; done
  done
  echo "$(date +%T) shard $shard of $shards done"
  exit 0
fi
if [ "${1:-}" != report ]; then
  echo "usage: bash lab/results/protocol-v4.sh runs SHARD SHARDS | report" >&2
  exit 1
fi

# The report card of every rule on the warm-up of seed 0 (validation questions), in the regime
# and in the default toy: RL_STEPS=0 saves the warm-up as ckpt-000000.
card() {   # name overrides...
  local name=$1; shift
  if [ ! -d "$V/warmup-$name-s0/ckpt-000000" ]; then
    python train.py --SEED=0 --SFT_DIR=$V/sft --RL_STEPS=0 --EVAL_EVERY=0 \
      --OUT_DIR=$V/warmup-$name-s0 --overwrite "$@" > "$V/log-warmup-$name-s0.txt" 2>&1
  fi
  python evaluate.py $V/warmup-$name-s0 --credit --rules --validation \
    --json lab/results/credit-v4-$name-s0.json > lab/results/credit-v4-$name-s0.md
}
# shellcheck disable=SC2086
card regime $REGIME
card default

runs=$(for s in $(seq 0 29); do echo $V/grpo-s$s $V/evisd-s$s; done
       for s in 0 1 2 3 4 5 6 7 8 9; do
         for m in rlsd opsd sdar sd_search bicaa; do echo $V/$m-s$s; done
       done)
# shellcheck disable=SC2086
python evaluate.py $runs --worlds $EVAL_WORLDS_V4 --speed --json lab/results/results-v4.json \
  --plot lab/results/curves-v4.png > $V/results.txt 2>&1
echo "$(date +%T) done"
