#!/usr/bin/env bash
# One device lease, in priority order, for the `run` tool. A session has 15 minutes of device
# time, the machine's start included, and a warm machine takes a second call at once, so a
# lease is two calls back to back:
#   run(command="tests/gpu/lease.sh", carry=[".devdeps"], timeout_s=580)
#   run(command="LEASE_STAGES='suite inductor' LEASE_S=170 tests/gpu/lease.sh", timeout_s=180)
# (the second reuses build-gpu/, which stays on a warm machine). Stages:
#   build    core, against the machine's python3 and torch (took 76 s on the H100)
#   cupti    tests/gpu/cupti_check.cu, in the background (a few milliseconds of GPU work)
#   focus    the fx backends' tests (inductor, cudagraphs: the static-parameter marking)
#   bench    bench/backends.py --quick --all-batches: every model at batch 1, then every model
#            at its larger batch; magpy's GPU backends beside torch.compile (about 35 s per
#            model and batch); gets what is left of the call
#   suite    the whole Python suite, one pytest per file (85 s)
#   inductor a few behaviour files with every region compiled by inductor
# Each stage gets at most its own limit and never more than what is left of LEASE_S seconds
# (what any stage wrote comes back even when the call is cut off). Files land in $OUT, at most
# eight of them per call (the lease brings back no more): build.log, cupti.log, each test
# stage's report.txt, gpu-bench.txt and .json.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$PWD/gpu-out}
stages=${LEASE_STAGES:-build cupti focus bench}
has() { [[ " $stages " == *" $1 "* ]]; }
end=$(( $(date +%s) + ${LEASE_S:-560} ))
left() { local l=$(( end - $(date +%s) - 5 )); (( l < $1 )) && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
echo "lease start $(date +%T)"
has build && MAGPY_BUILD_TIMEOUT=$(left 150) tests/gpu/run.sh build > /dev/null 2>&1
ls build-gpu/python/_magpy* > /dev/null 2>&1 || { echo "no build: see $OUT/build.log"; tail -30 "$OUT/build.log"; exit 1; }
has cupti && { timeout "$(left 150)" tests/gpu/run.sh cupti > /dev/null 2>&1 & }
if has focus; then
    OUT=$OUT/focus MAGPY_TEST_TIMEOUT=$(left 60) MAGPY_TEST_PER=55 \
        MAGPY_TEST_FILES="${LEASE_FOCUS_FILES:-test_backend_fx.py test_caught_exceptions.py test_nn_modules.py}" \
        tests/gpu/run.sh test
fi
if has bench; then
    # -v: each worker's log (tracebacks of n/a rows, whether magpy-cudagraphs marked the
    # parameters static, inductor's performance hints) goes into gpu-bench.txt
    TORCH_LOGS=${LEASE_TORCH_LOGS-perf_hints} MAGPY_BENCH_TIMEOUT=$(left 600) \
        MAGPY_BENCH_ARGS="${LEASE_BENCH_ARGS:---quick --all-batches -v --systems magpy-torchscript-freeze,magpy-inductor,magpy-cudagraphs,torch.compile}" \
        tests/gpu/run.sh bench 2>&1 | grep -v "^# .* done" | grep -v "^\[" | tail -70
fi
if has suite; then
    MAGPY_TEST_TIMEOUT=$(left 100) MAGPY_TEST_PER=95 tests/gpu/run.sh test
fi
if has inductor; then
    OUT=$OUT/inductor MAGPY_TEST_BACKEND=inductor TORCHINDUCTOR_COMPILE_THREADS=2 \
        MAGPY_TEST_TIMEOUT=$(left 120) MAGPY_TEST_PER=110 MAGPY_TEST_JOBS=6 \
        MAGPY_TEST_FILES="${LEASE_INDUCTOR_FILES:-test_nn_modules.py test_training_steps.py test_backend_fx.py test_callees_compiled.py test_resume.py test_breaks.py test_inplace.py}" \
        tests/gpu/run.sh test
fi
wait
has cupti && { echo "cupti: $(tail -1 "$OUT/cupti.log" 2>/dev/null)"; }
echo "lease end $(date +%T)"
