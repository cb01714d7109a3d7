#!/usr/bin/env bash
# One GPU session's device calls, in order (benchmarks/gpu/PLAN.md gives the `run` parameters):
#
#   bash benchmarks/gpu/session.sh 1   # carry [".carry/a"]: part A + wheels; MFU, exact prefill, Self-Extend/DCA, plan
#   bash benchmarks/gpu/session.sh 2   # carry [".carry/b"], right after call 1: the real fine-tune (~7 min)
#   bash benchmarks/gpu/session.sh smoke   # every script's --cpu-smoke, here or there
#
# Results go to $OUT/<item>/ (the device tool brings $OUT back), logs to $OUT/logs/. A failing item
# does not stop the next one; each runs under its own time limit.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/hf_posext_out}
PY=${PYTHON:-python3}
mkdir -p "$OUT/logs"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME SECONDS COMMAND...: run under a limit, log to $OUT/logs/NAME.log, show its tail
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $(( $(date +%s) - start )) s"
    tail -n 20 "$OUT/logs/$name.log"
}

machine() {
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/logs/gpu.txt" 2>&1
    else
        echo "no nvidia-smi" > "$OUT/logs/gpu.txt"
    fi
    "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__,
transformers.__file__)" >> "$OUT/logs/gpu.txt" 2>&1
    cat "$OUT/logs/gpu.txt"
}

case "${1:-}" in
    1)
        "$PY" benchmarks/gpu/carry_model.py receive a || exit 1
        source /tmp/hf_posext_carry/env.sh
        machine
        step mfu 100 "$PY" benchmarks/gpu/mfu.py --out "$OUT/mfu" --profile
        step prefill 60 "$PY" benchmarks/gpu/prefill.py --out "$OUT/prefill" --budget-minutes 0.75
        step sedca 40 "$PY" benchmarks/gpu/sedca.py --out "$OUT/sedca" --budget-minutes 0.45
        step plan_memory 120 "$PY" benchmarks/gpu/plan_memory.py --out "$OUT/plan_memory" --lengths 4096 16384
        ;;
    2)
        "$PY" benchmarks/gpu/carry_model.py receive b || exit 1
        source /tmp/hf_posext_carry/env.sh
        machine
        step finetune_real "${FINETUNE_LIMIT:-450}" "$PY" benchmarks/gpu/finetune_real.py \
            --gguf /tmp/hf_posext_carry/SmolLM2-135M-Instruct.Q4_1.gguf --out "$OUT/finetune_real" \
            --deadline-minutes "${DEADLINE_MINUTES:-7}"
        ;;
    smoke)
        for script in finetune_real mfu prefill sedca plan_memory; do
            step "smoke_$script" 120 "$PY" "benchmarks/gpu/$script.py" --cpu-smoke --out "$OUT/smoke/$script"
        done
        ;;
    *)
        echo "usage: bash benchmarks/gpu/session.sh 1|2|smoke (see benchmarks/gpu/PLAN.md)" >&2
        exit 2
        ;;
esac
