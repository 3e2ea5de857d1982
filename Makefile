# Two entry points: `make demo` (set up + runs on the embedded SmolLM2 pair) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

setup: $(BIN)/python
	bash scripts/setup.sh $(VENV)

# The default run on the embedded SmolLM2-135M-Instruct pair: the suffix drafter with the committed EAGLE-3 head as
# fallback (gamma 10), lossless, next to autoregressive decoding of the same 8 prompts; runtime.dtype=auto.
demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/python launch.py

# Two pytest workers (the machines have 2 cores; each test runs one torch thread), whole files per worker so
# a file's module-scoped fixtures load once. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: setup
	$(BIN)/ruff check specbench tests launch.py benchmarks

bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/engine_vs_hf.py --questions ../shared/data/spec_bench/question.jsonl
