#!/usr/bin/env bash
# Samples, or resumes, every piece of the embedded verifier's greedy corpus (data/corpus/smollm2-greedy), in
# order: a finished (archived) shard samples nothing, an unfinished one continues where it stopped. Commit the
# new rows-shard*.jsonl.gz / .metadata.json / .settings.json files after each finished shard.
#   bash scripts/synth_corpus.sh            # THREADS=2 on an idle machine
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-1}
OUT=data/corpus/smollm2-greedy
common=(task=synth synth.max_new_tokens=256 synth.target_len=1280
        synth.max_prompt_len=1024 synth.batch_size=32 synth.compress=true runtime.dtype=float32
        "runtime.num_threads=$THREADS" tracking=none)
piece() {
  local name=$1
  shift
  HF_HUB_OFFLINE=1 "$PY" launch.py "${common[@]}" "$@" "synth.output_dir=$OUT/$name" \
    "hydra.run.dir=runs/synth-logs/$name-$(date +%Y%m%d-%H%M%S)"
}
# A piece in N shards: each finished shard can be committed on its own.
sharded() {
  local name=$1 shards=$2
  shift 2
  for ((shard = 0; shard < shards; shard++)); do
    piece "$name" "synth.num_shards=$shards" "synth.shard_id=$shard" "$@"
  done
}
greedy=(synth.temperature=0.0)
piece spec_bench-train dataset=spec_bench dataset.subset=train "${greedy[@]}"
piece humaneval dataset=humaneval "${greedy[@]}"
# Real prompts fall short of the token budget: two more answers per training-part question, sampled at T 0.7.
piece spec_bench-train-t07 dataset=spec_bench dataset.subset=train synth.temperature=0.7 synth.top_p=0.95 \
  synth.responses_per_prompt=2 synth.seed=1
# chatterbot-corpus's 749 distinct English opening lines (dataset=chatterbot, in the corpus manifest), greedy.
piece chatterbot dataset=chatterbot "${greedy[@]}"
# The corpus manifest's LeetCode statements and inspect-evals queries (dataset=corpus picks one source by its
# category, so that only prompts that passed the manifest's overlap checks are sampled), greedy, in 4 shards each.
sharded leetcode 4 dataset=corpus "dataset.categories=[leetcode]" "${greedy[@]}"
sharded inspect_evals 4 dataset=corpus "dataset.categories=[inspect_evals]" "${greedy[@]}"
# Two more answers per chatterbot opening line at T 0.7, top-p 0.95 (seed 1), in two shards.
sharded chatterbot-t07 2 dataset=chatterbot synth.temperature=0.7 synth.top_p=0.95 synth.responses_per_prompt=2 \
  synth.seed=1
# The manifest's openai/evals prompts (12,717; exam, puzzle and classification prompts, most with short
# answers), greedy, in 8 shards.
sharded openai_evals 8 dataset=corpus "dataset.categories=[openai_evals]" "${greedy[@]}"
