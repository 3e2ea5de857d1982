#!/usr/bin/env bash
# The data-scaling runs of issue 48 (docs/eagle3.md#training-at-scale-issue-48): EAGLE-3 heads trained on nested
# token budgets of the committed corpus, SFT and on-policy distillation (OPD) at equal steps.
#
#   bash scripts/train_scaling.sh                      # every size, in order; THREADS=2 on an idle machine
#   SIZES="64000 250000" bash scripts/train_scaling.sh # some sizes
#
# Per size N (train.data_tokens; "all": the whole corpus), with S = STEPS_PER_MTOK * N / 1e6 steps (at least
# MIN_STEPS):
#   base-N      SFT for S/2 steps from the verifier's last layer (lr 5e-4), the common start of
#   sft-N       SFT for S/2 more steps from base-N's head (lr 1e-4)
#   opd-N       on-policy distillation for S/2 steps from base-N's head (lr 1e-4)
# so sft-N and opd-N differ only in the objective of their last S/2 steps: S steps each, the same compute
# counters (docs/training.md#training-compute). ttt_steps 4 unrolls the chain past the γ 3 the curve measures.
# Every run reads one feature cache, which holds the rows some run needed: the first run of a size passes its
# budget's rows through the verifier, a larger size adds only the rows missing (delete it after the corpus
# grows). So the small sizes train without waiting for the whole corpus' pass (about 1.9 M tokens, over an hour
# on two cores), and sizes can run in separate sessions. Every run drops the rows that overlap held-out
# questions, validates on the corpus' own validation split and ships the best validation step
# (train.select_by). A finished run (trained.pt present) is skipped; an unfinished one resumes its last.ckpt,
# so the script can be killed and rerun at any point.
# The curve: python benchmarks/eagle3_scaling.py --runs runs/scaling ... (docs/eagle3.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-1}
OUT=${OUT:-runs/scaling}
SIZES=${SIZES:-64000 250000 500000 all}
# batch 8 of rows of ~150 generated tokens: about one epoch; a step took about 8 s at ttt_steps 7 on one core
STEPS_PER_MTOK=${STEPS_PER_MTOK:-1000}
MIN_STEPS=${MIN_STEPS:-200}
ALL_TOKENS=${ALL_TOKENS:-1055646}  # what the step count of size "all" assumes (the corpus' generated tokens)
# The pieces of the corpus with at least one finished shard (an unfinished piece contributes its finished
# shards). Run the curve on a corpus that no longer grows: the feature cache and the budgets' row order are
# those of one corpus, and a grown one is refused by the cache (delete $OUT to start over).
finished() {
  local dir
  for dir in data/corpus/smollm2-greedy/*/; do
    if compgen -G "$dir/rows-shard*.jsonl.gz" > /dev/null; then echo "${dir%/}"; fi
  done | paste -sd, -
}
CORPUS=${CORPUS:-$(finished)}
common=(model/drafter=eagle3 "train.data='$CORPUS'" "train.feature_cache=$OUT/features" train.feature_top_k=64
        train.draft_vocab_size=8192 train.ttt_steps=4 train.drop_heldout_overlap=true
        train.select_by=val/tau_estimate
        train.batch_size=8 train.val_every_steps=100 train.checkpoint_every_steps=50 train.val_prompts=0
        train.lr_end=2e-5 train.warmup_steps=20 runtime.dtype=float32 "runtime.num_threads=$THREADS"
        tracking=none)

run() {  # run NAME OVERRIDES...: one training run into $OUT/NAME, skipped when finished
  local name=$1
  shift
  if [ -f "$OUT/$name/trained.pt" ]; then
    echo "$name: finished ($OUT/$name/trained.pt)"
    return
  fi
  HF_HUB_OFFLINE=1 "$PY" launch.py task=train "${common[@]}" "$@" "train.output_dir=$OUT/$name" \
    "hydra.run.dir=$OUT/logs/$name-$(date +%Y%m%d-%H%M%S)"
}

for size in $SIZES; do
  if [ "$size" = all ]; then
    budget=train.data_tokens=null
    steps=$(( STEPS_PER_MTOK * ALL_TOKENS / 1000000 ))
  else
    budget=train.data_tokens=$size
    steps=$(( STEPS_PER_MTOK * size / 1000000 ))
  fi
  steps=$(( steps < MIN_STEPS ? MIN_STEPS : steps ))
  half=$(( steps / 2 ))
  run "base-$size" method=eagle3 "$budget" train.init_layer=verifier_last "train.max_steps=$half" \
    train.lr_start=5e-4
  for objective in sft opd; do
    method=eagle3
    [ "$objective" = opd ] && method=eagle3_opd
    run "$objective-$size" "method=$method" "$budget" "train.init_head=$OUT/base-$size/trained.pt" \
      "train.max_steps=$half" train.lr_start=1e-4
  done
done
