# Two entry points: `make demo` (set up + runs on the embedded SmolLM2 pair) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

setup: $(BIN)/python
	bash scripts/setup.sh $(VENV)

# The embedded pair with four drafters, each next to autoregressive decoding of the same prompts: the
# model-free suffix drafter and the committed EAGLE-3 head (both with the cost-aware draft length), the
# suffix drafter with the head as fallback, the early-exit default. bf16 with the row-invariant CPU forwards (docs/engine.md): on CPUs with native bf16
# dot products it is faster than float32 and speculative outputs stay identical; DEMO_DTYPE=float32 otherwise.
DEMO_DTYPE ?= bfloat16
demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/python launch.py model/drafter=suffix-smollm2 schedule=cost_aware runtime.dtype=$(DEMO_DTYPE)
	HF_HUB_OFFLINE=1 $(BIN)/python launch.py model/drafter=eagle3-smollm2 schedule=cost_aware runtime.dtype=$(DEMO_DTYPE)
	HF_HUB_OFFLINE=1 $(BIN)/python launch.py model/drafter=suffix-eagle3-smollm2 schedule.gamma=10 runtime.dtype=$(DEMO_DTYPE)
	HF_HUB_OFFLINE=1 $(BIN)/python launch.py runtime.dtype=$(DEMO_DTYPE)

# Two pytest workers (the machines have 2 cores; each test runs one torch thread), whole files per worker so
# a file's module-scoped fixtures load once. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: setup
	$(BIN)/ruff check specbench tests launch.py benchmarks

bench: setup
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/engine_vs_hf.py --questions ../shared/data/spec_bench/question.jsonl
