#!/usr/bin/env bash
# The GPU check (benchmarks/gpu/check.py): one NVIDIA GPU, under 8 minutes; prints one table and
# writes benchmarks/results/gpu/check.json (+ dynamic_decode.json). Run from anywhere:
#
#   bash benchmarks/gpu/check.sh                   # every item
#   bash benchmarks/gpu/check.sh --only mfu        # some items
#   bash benchmarks/gpu/check.sh --cpu-smoke --out /tmp/smoke.json   # plumbing on CPU
#
# Items whose package is missing (flash_attn) are skipped with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
exec timeout 480 "${PYTHON:-python3}" benchmarks/gpu/check.py "$@"
