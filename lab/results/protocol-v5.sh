#!/bin/bash
# Benchmark v5 (issue 47): the paper's ablation table on the default toy, each row with its
# interval. Written and committed before any run of it. Run from the repository root, as two
# shards of one thread each (two processes of two threads on two shared cores spin and crawl),
# then the report:
#   OMP_NUM_THREADS=1 nohup bash lab/results/protocol-v5.sh runs 0 2 > out/v5/shard0.log 2>&1 &
#   OMP_NUM_THREADS=1 nohup bash lab/results/protocol-v5.sh runs 1 2 > out/v5/shard1.log 2>&1 &
#   bash lab/results/protocol-v5.sh report          # once both shards are done
# Shard k of n plays the seeds s with s % n == k. Restartable: a finished run (its ckpt-000060
# and held-out EM) is skipped, an interrupted one continues with --resume; each run logs to
# out/v5/log-<name>-s<seed>.txt. The runs are deterministic given the seed and the thread count,
# so sharing the cores with other work slows them and changes nothing else.
#
# Setting: the default toy and train.py's defaults (tiny model with the previous-token head, 750
# warm-up steps, 60 RL steps of 8 questions x 8 samples, TEMPERATURE 0.5), EviSD as the paper
# designs it (issue 44): action-aligned teacher contexts, content span, bounded modulation,
# lambda 0.2, tau 5. EVAL_EVERY=10 (the quick check at steps 0, 10, ..., 60). All runs of a seed
# share its warm-up (cached in out/v5/sft) and its step-0 batch (runs.seed_everything).
#
# Runs (name: overrides), the paper's ablation figure (7B, macro EM, one run each) in brackets:
#   seeds 0-29  grpo             --METHOD=grpo
#               evisd            --METHOD=evisd (the default)
#   seeds 0-9   evisd-response   --EVISD_SPAN=response          whole-response modulation [-7.1]
#               evisd-gated-loss --EVISD_FORM=gated_loss        a response-wide gated loss [-5.8]
#               evisd-answer-only --USE_SEARCH_EVIDENCE=False   answer-only privilege      [-2.1]
#               evisd-shared     --TEACHER_CONTEXT=shared       one shared context         [-0.2]
#               evisd-lam0.5     --EVISD_LAMBDA=0.5             the dose the paper leaves to its
#               evisd-lam0.9     --EVISD_LAMBDA=0.9             supplement
#   Order: seeds 0-9 seed by seed, the eight runs of a seed in the order above; then seeds
#   10-29, grpo and evisd. Nothing is tuned: every setting is the default or the paper's row.
# Then the report card (evaluate.py --credit --variants --validation) of every row on the warm-up
# of seed 0: validation worlds, which no comparison here uses.
#
# Measures, paired by seed: mean difference and 95% t-interval over seeds.
#   primary  held-out macro EM (mean of 1- and 2-hop) of the final checkpoint, greedy, over
#            EVAL_WORLDS_V5 = 18 held-out worlds (as v4: ~2,180 test and ood questions).
#   also     1-hop, 2-hop and 3-hop EM; learning speed as in v3 and v4 (evaluate.py --speed:
#            clear step and area of label_search_partial and label_answer_premature, the quick
#            check's area).
# Comparisons:
#   headline  EviSD - GRPO, 30 seeds.
#   rows      each ablation row and dose - EviSD, on seeds 0-9 (the paper's table compares
#             every row with the full method); each also - GRPO, on the same seeds.
# Power: v3's paired macro sd on the default toy was 0.0207 (9 worlds); with 30 seeds the
#   half-width is t_29 * 0.0207 / sqrt(30) = 0.0077; with 10 seeds t_9 * 0.0207 / sqrt(10) =
#   0.015, which separates the paper's -0.071 and -0.058 from 0, not its -0.021 or -0.002.
# Decision rule (each comparison, primary measure):
#   lower bound > 0   -> helps (for a row: better than EviSD);
#   upper bound < 0   -> hurts (for a row: worse than EviSD, as the paper's table says);
#   otherwise         -> no difference detected, with the half-width reached; whether the
#                        paper's figure (points / 100) lies inside the interval is said.
# If the spread is larger than planned: no seed is added after looking (adding seeds until an
#   interval clears 0 biases it). The report gives the sd and half-width reached and the number
#   of seeds that sd would need for +-0.008 (headline) or +-0.015 (rows); a later benchmark
#   fixes that number before its runs. The same holds if a shard cannot finish: the report
#   says which runs are missing and reads each comparison on the seeds that have both runs.
# Budget: ~4.5 hours of the 2 cores (v4: ~3.5 min per one-thread run with its evaluation).
set -euo pipefail
V=out/v5
EVAL_WORLDS_V5=18
mkdir -p $V

train() {   # name seed overrides...
  local name=$1 seed=$2; shift 2
  local run=$V/$name-s$seed
  if [ ! -d "$run/ckpt-000060" ]; then
    echo "$(date +%T) $name seed $seed"
    python train.py --SEED="$seed" --SFT_DIR=$V/sft --OUT_DIR="$run" --EVAL_EVERY=10 --resume \
      "$@" > "$V/log-$name-s$seed.txt" 2>&1
  fi
  python evaluate.py "$run" --worlds $EVAL_WORLDS_V5 > /dev/null 2>> "$V/log-$name-s$seed.txt"
}

if [ "${1:-}" = runs ]; then
  shard=${2:-0} shards=${3:-1}
  for s in 0 1 2 3 4 5 6 7 8 9; do
    if [ $((s % shards)) -ne "$shard" ]; then continue; fi
    train grpo "$s" --METHOD=grpo
    train evisd "$s" --METHOD=evisd
    train evisd-response "$s" --METHOD=evisd --EVISD_SPAN=response
    train evisd-gated-loss "$s" --METHOD=evisd --EVISD_FORM=gated_loss
    train evisd-answer-only "$s" --METHOD=evisd --USE_SEARCH_EVIDENCE=False
    train evisd-shared "$s" --METHOD=evisd --TEACHER_CONTEXT=shared
    train evisd-lam0.5 "$s" --METHOD=evisd --EVISD_LAMBDA=0.5
    train evisd-lam0.9 "$s" --METHOD=evisd --EVISD_LAMBDA=0.9
  done
  for s in $(seq 10 29); do
    if [ $((s % shards)) -ne "$shard" ]; then continue; fi
    train grpo "$s" --METHOD=grpo
    train evisd "$s" --METHOD=evisd
  done
  echo "$(date +%T) shard $shard of $shards done"
  exit 0
fi
if [ "${1:-}" != report ]; then
  echo "usage: bash lab/results/protocol-v5.sh runs SHARD SHARDS | report" >&2
  exit 1
fi

# The report card of every row on the warm-up of seed 0 (validation questions): RL_STEPS=0 saves
# the warm-up as ckpt-000000.
if [ ! -d "$V/warmup-s0/ckpt-000000" ]; then
  python train.py --SEED=0 --SFT_DIR=$V/sft --RL_STEPS=0 --EVAL_EVERY=0 --OUT_DIR=$V/warmup-s0 \
    --overwrite > "$V/log-warmup-s0.txt" 2>&1
fi
python evaluate.py $V/warmup-s0 --credit --variants --validation \
  --json lab/results/credit-v5-s0.json > lab/results/credit-v5-s0.md

runs=$(for s in $(seq 0 29); do echo $V/grpo-s$s $V/evisd-s$s; done
       for s in 0 1 2 3 4 5 6 7 8 9; do
         for n in response gated-loss answer-only shared lam0.5 lam0.9; do echo $V/evisd-$n-s$s; done
       done)
# shellcheck disable=SC2086
python evaluate.py $(for r in $runs; do [ -d "$r/ckpt-000060" ] && echo "$r"; done) \
  --worlds $EVAL_WORLDS_V5 --speed --json lab/results/results-v5.json > $V/results.txt 2>&1
echo "$(date +%T) done"
