# Tasks: `make test`, `make bench`, `make lint`, `make format`, `make gpu-check`.
# Run them inside the environment the README's quick start makes (. .venv/bin/activate).
PYTHON ?= python
C_SOURCES := $(wildcard c/*.c c/*.h) harness/backends/c/fast_call.c
# cuda/ has a .clang-format of its own (`T* p` pointers, as the kernels write them)
CUDA_SOURCES := $(wildcard cuda/*.cu cuda/*.h cuda/emu/*.h cuda/emu/include/*.h)
GPU_OUT ?= gpu-out

.PHONY: help test test-all bench lint format gpu-check compare

help:
	@echo "make test       the fast tier: what a contributor runs (3 minutes on 2 cores)"
	@echo "make test-all   the fast tier, then the full tier (sanitizers, builds, mutants, wheel)"
	@echo "make bench      the pytest-benchmark suite at its default shapes"
	@echo "make compare    the main comparison table (128, 256 and 1024 cubed)"
	@echo "make lint       ruff (lint and format check), the layer contracts (lint-imports) and clang-format, as CI runs them"
	@echo "make format     rewrite the sources in the project's style"
	@echo "make gpu-check  every GPU check, on a machine with an NVIDIA GPU (into GPU_OUT=$(GPU_OUT))"

test:
	$(PYTHON) -m pytest

test-all: test
	$(PYTHON) -m pytest -m slow

bench:
	$(PYTHON) -m pytest --benchmark-only

compare:
	$(PYTHON) -m harness compare --shapes 128 256 1024

lint:
	ruff check .
	ruff format --check .
	lint-imports --no-cache
	clang-format --dry-run --Werror $(C_SOURCES) $(CUDA_SOURCES)

format:
	ruff check --fix .
	ruff format .
	clang-format -i $(C_SOURCES) $(CUDA_SOURCES)

gpu-check:
	scripts/gpu_check.sh $(GPU_OUT)
