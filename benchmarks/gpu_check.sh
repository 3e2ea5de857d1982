#!/usr/bin/env bash
# GPU readiness check: on a machine with an NVIDIA GPU and no hub access, set up (or reuse .venv), run the
# GPU tests, the engine-vs-HF benchmark in bf16 and the embedded pair with the committed EAGLE-3 head, and
# write every figure to one JSON file ($OUT/gpu_check.json, else outputs/gpu_check.json) and the benchmarks' result
# records to $OUT/results (copy them into results/ to render them). Budget: < 8 min.
#   bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-outputs}"
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1
PY=.venv/bin/python
[ -x "$PY" ] || make setup >"$OUT_DIR/gpu_setup.log" 2>&1 || { echo "setup failed: $OUT_DIR/gpu_setup.log"; exit 1; }
log() { echo "[gpu_check $(date +%H:%M:%S)] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT_DIR/gpu_name.txt" 2>&1
log "gpu: $(cat "$OUT_DIR/gpu_name.txt")"
log "pytest -m gpu"
timeout 180 "$PY" -m pytest -q -m gpu -p no:cacheprovider >"$OUT_DIR/gpu_pytest.log" 2>&1
echo $? >"$OUT_DIR/gpu_pytest.rc"
log "engine vs HF (bf16, cuda)"
timeout 150 "$PY" benchmarks/engine_vs_hf.py --questions ../shared/data/spec_bench/question.jsonl --num-prompts 10 \
  --device cuda --dtype bfloat16 --json-out "$OUT_DIR/gpu_engine_vs_hf.json" --results-dir "$OUT_DIR/results" >"$OUT_DIR/gpu_engine_vs_hf.log" 2>&1
echo $? >"$OUT_DIR/gpu_engine_vs_hf.rc"
log "EAGLE-3 head on the embedded pair (bf16, cuda)"
timeout 150 "$PY" benchmarks/eagle3.py --device cuda --dtype bfloat16 --per-task 2 --max-new-tokens 128 \
  --gammas 3 --fallback 2 --suffix --out-dir "$OUT_DIR/gpu_eagle3" --results-dir "$OUT_DIR/results" >"$OUT_DIR/gpu_eagle3.log" 2>&1
echo $? >"$OUT_DIR/gpu_eagle3.rc"
"$PY" - "$OUT_DIR" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def read(name):
    path = out / name
    return json.loads(path.read_text()) if path.is_file() else None
def rc(name):
    path = out / f"{name}.rc"
    return int(path.read_text()) if path.is_file() else None
def tail(name, lines=15):
    path = out / f"{name}.log"
    return path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else []
report = {
    "gpu": (out / "gpu_name.txt").read_text().strip() if (out / "gpu_name.txt").is_file() else None,
    "pytest_gpu": {"rc": rc("gpu_pytest"), "tail": tail("gpu_pytest", 5)},
    "engine_vs_hf": {"rc": rc("gpu_engine_vs_hf"), "figures": read("gpu_engine_vs_hf.json"), "tail": tail("gpu_engine_vs_hf")},
    "eagle3": {"rc": rc("gpu_eagle3"), "figures": read("gpu_eagle3/eagle3.json"), "tail": tail("gpu_eagle3")},
}
(out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps({k: (v["rc"] if isinstance(v, dict) else v) for k, v in report.items()}))
PY
