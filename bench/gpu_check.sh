#!/usr/bin/env bash
# The one prepared GPU check (issues 11 and 38): the bundled wheels installed, the environment checked,
# the CUDA tests, then a short GPU benchmark. Runs from the working tree (PYTHONPATH; the wheels of
# bench/gpu_wheels/ -- `make gpu-bundle` -- installed into a target folder, no index), under 6 minutes,
# and writes its logs to $OUT when set (else bench/gpu_check_logs/). Without a GPU the CUDA tests skip
# and the script says so: `make gpu-rehearse` runs it in the GPU machine's Python environment first.
#   bash bench/gpu_check.sh            PYTHON=/path/to/python bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOGS=${OUT:-$ROOT/bench/gpu_check_logs}
WHEELS=$ROOT/bench/gpu_wheels
SITE=${GPU_SITE:-${TMPDIR:-/tmp}/gradcheck-gpu-site}
mkdir -p "$LOGS"
rm -f "$LOGS"/{install,env,env_problems,tests,bench,summary}.txt "$LOGS/tests.xml"  # this run's logs only
export PYTHONPATH="$ROOT:$ROOT/clients/python${PYTHONPATH:+:$PYTHONPATH}"
status=0
phase() { echo "== $1 (t=${SECONDS}s)" | tee -a "$LOGS/$2"; }

# the wheels the machine lacks, into a folder of their own that precedes its site-packages
phase "bundled wheels" install.txt
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  rm -rf "$SITE"
  if "$PY" -m pip --version >/dev/null 2>&1; then
    install=("$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --target "$SITE")
  else  # no pip there: unpacking a wheel is installing it, for these (no scripts, no data files)
    install=("$PY" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" "$SITE")
  fi
  if ! "${install[@]}" "$WHEELS"/*.whl >>"$LOGS/install.txt" 2>&1; then
    echo "gpu_check: installing bench/gpu_wheels into $SITE failed: $(tail -1 "$LOGS/install.txt")" | tee -a "$LOGS/summary.txt"
    exit 2
  fi
  export PYTHONPATH="$PYTHONPATH:$SITE"
  ls "$WHEELS" | tee -a "$LOGS/install.txt"
else
  echo "no bench/gpu_wheels (make gpu-bundle): the machine's own distributions only" | tee -a "$LOGS/install.txt"
fi

# every distribution and import the run needs, at versions the project accepts: one line and exit 2 if not
phase "environment" env.txt
{ date -u; "$PY" --version; command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -c "from gradcheck_svc.backend import _cupy; c, why = _cupy(); print('cupy', c.__version__ if c else 'unavailable:', '' if c else why)"
  "$PY" -c "import sys; sys.path.insert(0, 'tests'); import cuda_compile as c; print('CUDA compiler:', c.compiler(), '| CuPy headers:', c.cupy_include())"
} 2>&1 | tee -a "$LOGS/env.txt"
if ! "$PY" bench/gpu_env.py >>"$LOGS/env.txt" 2>"$LOGS/env_problems.txt"; then
  tee -a "$LOGS/summary.txt" <"$LOGS/env_problems.txt"
  exit 2
fi
tail -1 "$LOGS/env.txt"

GPU=$("$PY" -c "from gradcheck_svc.backend import cuda_available; print(int(cuda_available()))")

# the CUDA tests (they skip "no CUDA device" without one): fingerprints, checkpoint + memory pool,
# expr kernels (and their NVRTC compile, test_cuda_kernels.py), and every op / example / bug-zoo case
# on "cuda" vs NumPy (test_strict_backend.py, whose "strict" half runs too); the junit XML keeps every outcome
phase "CUDA tests" tests.txt
timeout 170 "$PY" -m pytest -q -rs -p no:cacheprovider --junitxml="$LOGS/tests.xml" \
    tests/engine/test_integrity.py tests/engine/test_checkpoint.py tests/ops/test_expr_op.py tests/engine/test_engine.py \
    tests/engine/test_strict_backend.py tests/engine/test_cuda_kernels.py -k "gpu or cuda or cupy or strict" 2>&1 | tee -a "$LOGS/tests.txt"
rc=${PIPESTATUS[0]}; [ "$rc" -ne 0 ] && status=$rc
skipped=$(grep -o "^SKIPPED \[[0-9]*\].*CUDA" "$LOGS/tests.txt" | awk -F'[][]' '{n += $2} END {print n + 0}')
if [ "$GPU" = 1 ] && [ "$skipped" -gt 0 ]; then
  echo "gpu_check: a CUDA device is visible but $skipped CUDA tests skipped" | tee -a "$LOGS/tests.txt"; status=1
fi

phase "GPU benchmark" bench.txt
if [ "$GPU" = 1 ]; then BENCH_ARGS=(); else BENCH_ARGS=(--rehearse); fi  # CPU: the same code, small, on the stand-in
timeout 140 "$PY" bench/bench_gpu.py "${BENCH_ARGS[@]}" 2>&1 | tee -a "$LOGS/bench.txt"
rc=${PIPESTATUS[0]}; [ "$rc" -ne 0 ] && status=$rc

if [ "$GPU" = 1 ]; then
  echo "gpu_check: done on the GPU in ${SECONDS}s, exit $status; logs in $LOGS" | tee -a "$LOGS/summary.txt"
else
  echo "gpu_check: no CUDA device here: the $skipped CUDA tests skipped and the benchmark was rehearsed on the CPU stand-in;" \
       "the script itself ran in ${SECONDS}s (exit $status); logs in $LOGS" | tee -a "$LOGS/summary.txt"
fi
exit $status
