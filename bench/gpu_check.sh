#!/usr/bin/env bash
# One prepared GPU check (issue 11, item 5): the CUDA tests, then a short GPU benchmark.
# Runs from the working tree (PYTHONPATH, nothing installed), under 6 minutes, and writes its
# logs to $OUT when set (else bench/gpu_check_logs/). Without a GPU the CUDA tests skip and the
# script says so: rehearse it on a CPU machine before spending the one GPU run.
#   bash bench/gpu_check.sh            PYTHON=/path/to/python bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOGS=${OUT:-$ROOT/bench/gpu_check_logs}
mkdir -p "$LOGS"
export PYTHONPATH="$ROOT:$ROOT/clients/python${PYTHONPATH:+:$PYTHONPATH}"
status=0

{ date -u; "$PY" --version; command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "from gradcheck_svc.backend import _cupy; c, why = _cupy(); print('cupy', c.__version__ if c else 'unavailable:', '' if c else why)"
} 2>&1 | tee "$LOGS/env.txt"
GPU=$("$PY" -c "from gradcheck_svc.backend import cuda_available; print(int(cuda_available()))")

# the CUDA tests (they skip "no CUDA device" without one): fingerprints, checkpoint + memory pool,
# expr kernels, and every op / example / bug-zoo case on "cuda" vs NumPy (test_strict_backend.py,
# whose "strict" half runs too); the junit XML keeps every outcome
echo "== CUDA tests" | tee "$LOGS/tests.txt"
timeout 180 "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$LOGS/tests.xml" \
    tests/test_integrity.py tests/test_checkpoint.py tests/test_expr_op.py tests/test_engine.py \
    tests/test_strict_backend.py -k "gpu or cuda or cupy or strict" 2>&1 | tee -a "$LOGS/tests.txt"
rc=${PIPESTATUS[0]}; [ "$rc" -ne 0 ] && status=$rc
skipped=$(grep -o "^SKIPPED \[[0-9]*\].*CUDA" "$LOGS/tests.txt" | awk -F'[][]' '{n += $2} END {print n + 0}')
if [ "$GPU" = 1 ] && [ "$skipped" -gt 0 ]; then
  echo "gpu_check: a CUDA device is visible but $skipped CUDA tests skipped" | tee -a "$LOGS/tests.txt"; status=1
fi

echo "== GPU benchmark" | tee "$LOGS/bench.txt"
if [ "$GPU" = 1 ]; then BENCH_ARGS=(); else BENCH_ARGS=(--rehearse); fi  # CPU: the same code, small, on the stand-in
timeout 150 "$PY" bench/bench_gpu.py "${BENCH_ARGS[@]}" 2>&1 | tee -a "$LOGS/bench.txt"
rc=${PIPESTATUS[0]}; [ "$rc" -ne 0 ] && status=$rc

if [ "$GPU" = 1 ]; then
  echo "gpu_check: done on the GPU, exit $status; logs in $LOGS" | tee "$LOGS/summary.txt"
else
  echo "gpu_check: no CUDA device here: the $skipped CUDA tests skipped and the benchmark was rehearsed on the CPU stand-in;" \
       "the script itself ran cleanly (exit $status); logs in $LOGS" | tee "$LOGS/summary.txt"
fi
exit $status
