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
common=(task=synth synth.temperature=0.0 synth.max_new_tokens=256 synth.target_len=1280
        synth.max_prompt_len=1024 synth.batch_size=32 synth.compress=true runtime.dtype=float32
        "runtime.num_threads=$THREADS" tracking=none)
piece() {
  local name=$1
  shift
  HF_HUB_OFFLINE=1 "$PY" launch.py "${common[@]}" "$@" "synth.output_dir=$OUT/$name" \
    "hydra.run.dir=runs/synth-logs/$name-$(date +%Y%m%d-%H%M%S)"
}
piece spec_bench-train dataset=spec_bench dataset.subset=train
piece humaneval dataset=humaneval
