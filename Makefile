# Two entry points: `make demo` (set up + runs on the embedded SmolLM2 pair) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

setup: $(BIN)/python
	bash scripts/setup.sh $(VENV)

# The embedded pair with three drafters, each next to autoregressive decoding of the same prompts: the
# model-free suffix drafter (cost-aware draft length), the committed EAGLE-3 head, the early-exit default.
demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/python launch.py model/drafter=suffix schedule=cost_aware
	HF_HUB_OFFLINE=1 $(BIN)/python launch.py model/drafter=eagle3-smollm2
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
