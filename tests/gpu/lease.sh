#!/usr/bin/env bash
# One device lease, in priority order, each stage with its own time limit, for the `run` tool:
#   run(command="tests/gpu/lease.sh", carry=[".devdeps"], timeout_s=600)
# The first four stages' limits add up to 590 s (a call may run 600 s; the build took 76 s on the
# H100 on 2026-11-27, not its 150); the last stage gets what is left, and what any stage wrote
# comes back even when the call is cut off. The bench needs about 230 s for its six models
# (30-46 s each, torch.compile's first calls included); the suite ran in 85 s.
# 1. build core (then the CUPTI check in the background); 2. the fx backends' tests (inductor, cudagraphs) and the files that failed on
# the last run; 3. the whole suite, one pytest per file; 4. the backends bench (--quick, all
# models, magpy's compiling backends beside torch.compile); 5. a few behaviour files with every
# region compiled by inductor (breaks, resumed segments, compiled callees). Everything lands in
# $OUT as seven files (the lease brings back at most eight): build.log, cupti.log, each test
# stage's report.txt, gpu-bench.txt and .json. LEASE_STAGES picks stages
# ("build cupti focus suite bench inductor").
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$PWD/gpu-out}
stages=${LEASE_STAGES:-build cupti focus suite bench inductor}
has() { [[ " $stages " == *" $1 "* ]]; }
echo "lease start $(date +%T)"
has build && MAGPY_BUILD_TIMEOUT=${LEASE_BUILD_S:-150} tests/gpu/run.sh build > /dev/null 2>&1
ls build-gpu/python/_magpy* > /dev/null 2>&1 || { echo "no build: see $OUT/build.log"; tail -30 "$OUT/build.log"; exit 1; }
# nvcc's compile of the CUPTI check overlaps the tests; its GPU work is a few milliseconds.
has cupti && { timeout "${LEASE_CUPTI_S:-150}" tests/gpu/run.sh cupti > /dev/null 2>&1 & }
if has focus; then
    OUT=$OUT/focus MAGPY_TEST_TIMEOUT=${LEASE_FOCUS_S:-100} MAGPY_TEST_PER=90 \
        MAGPY_TEST_FILES="${LEASE_FOCUS_FILES:-test_backend_fx.py test_newer_library_idioms.py test_library_idioms.py test_nn_modules.py test_backend_torchscript.py test_user_classes.py test_caught_exceptions.py test_guards.py test_training_steps.py test_dynamic_shapes.py test_fuzz.py}" \
        tests/gpu/run.sh test
fi
if has suite; then
    MAGPY_TEST_TIMEOUT=${LEASE_SUITE_S:-100} MAGPY_TEST_PER=95 tests/gpu/run.sh test
fi
if has bench; then
    # -v and inductor's performance hints put each worker's log in gpu-bench.txt: why a graph
    # was not recorded as a CUDA graph ("skipping cudagraphs due to ..."; the last run's conv
    # nets ran 6-7x slower under magpy-cudagraphs than under reduce-overhead)
    TORCH_LOGS=${LEASE_TORCH_LOGS-perf_hints} MAGPY_BENCH_TIMEOUT=${LEASE_BENCH_S:-240} \
        MAGPY_BENCH_ARGS="${LEASE_BENCH_ARGS:---quick -v --systems magpy-torchscript-freeze,magpy-inductor,magpy-cudagraphs,torch.compile}" \
        tests/gpu/run.sh bench 2>&1 | grep -v "^# .* done" | grep -v "^\[" | tail -70
fi
if has inductor; then
    OUT=$OUT/inductor MAGPY_TEST_BACKEND=inductor TORCHINDUCTOR_COMPILE_THREADS=2 \
        MAGPY_TEST_TIMEOUT=${LEASE_INDUCTOR_S:-120} MAGPY_TEST_PER=110 MAGPY_TEST_JOBS=6 \
        MAGPY_TEST_FILES="${LEASE_INDUCTOR_FILES:-test_nn_modules.py test_training_steps.py test_backend_fx.py test_callees_compiled.py test_resume.py test_breaks.py test_inplace.py}" \
        tests/gpu/run.sh test
fi
wait
has cupti && { echo "cupti: $(tail -1 "$OUT/cupti.log" 2>/dev/null)"; }
echo "lease end $(date +%T)"
