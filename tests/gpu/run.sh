#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU, CUDA's nvcc and a python3 that has torch
# (the device machine of the project's tooling: Python 3.12, torch 2.11 + CUDA 13). CI never
# runs this; see tests/gpu/README.md.
#
#   tests/gpu/run.sh STAGE...      stages: facts headers cupti build smoke test bench
#
# facts  interpreter facts (tests/gpu/py_facts.py, tests/gpu/trace_facts.py)
# headers  the interpreter's and torch's C headers as tarballs (to compile against here)
# cupti  builds tests/gpu/cupti_check.cu with nvcc and runs it (the CUPTI profiler on the GPU)
# build  configures and builds core/ (no kernel, no GoogleTest) into build-gpu/ with this python3
# smoke  tests/gpu/smoke.py: a few programs compiled beside eager, with explain()'s messages
# test   the Python test suite on the GPU build, one pytest per file in parallel (but the report
#        schema test: the device machine has no jsonschema); MAGPY_TEST_FILES picks files
# bench  bench/backends.py --device cuda (eager, torch.jit, torch.compile, magpy if it built)
#
# Outputs go to $OUT (default: gpu-out/). nlohmann_json, a header-only library that the device
# machine lacks, is taken from .devdeps/ when present (a copy of Debian's nlohmann-json3-dev).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-$(command -v python3)}
JOBS=$(nproc)
export PYTHONUNBUFFERED=1

stage() { echo; echo "=== $1 ($(date +%T))"; }

for s in "$@"; do
case "$s" in
facts)
    stage facts
    nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "python: $PY"; "$PY" -V
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
    command -v nvcc && nvcc --version | tail -1
    cmake --version | head -1; g++ --version | head -1
    "$PY" -c "import pybind11; print('pybind11', pybind11.__version__)"
    "$PY" tests/gpu/py_facts.py "$ROOT" > "$OUT/py-facts.json"
    "$PY" tests/gpu/trace_facts.py > "$OUT/trace-facts.txt" 2>&1; head -3 "$OUT/trace-facts.txt"
    exe=$(readlink -f "$("$PY" -c 'import sys; print(sys.executable)')")
    for sym in _PyFrame_ClearExceptCode _PyThreadState_PopFrame _PyTraceback_Add; do
        echo "$sym: $(nm -D "$exe" 2>/dev/null | grep -c " T $sym$") in $exe"
    done
    ;;
headers)
    stage headers
    inc=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
    tar czf "$OUT/py-include.tgz" -C "$(dirname "$inc")" "$(basename "$inc")"
    tinc=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
    tar czf /tmp/torch-include.tgz -C "$tinc" ATen c10 torch 2>/dev/null
    split -b 15m /tmp/torch-include.tgz "$OUT/torch-include.tgz.part"
    ls -la "$OUT"
    ;;
cupti)
    stage cupti
    cuda=$(dirname "$(dirname "$(command -v nvcc)")")
    nvcc -std=c++17 -O1 -I core/src -I "$cuda/extras/CUPTI/include" -DMAGPY_HAS_CUPTI \
        tests/gpu/cupti_check.cu core/src/profile/profiler.cpp core/src/profile/cupti_profiler.cpp \
        -L "$cuda/extras/CUPTI/lib64" -L "$cuda/lib64" -lcupti -ldl -o /tmp/cupti_check \
        && LD_LIBRARY_PATH="$cuda/lib64:$cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}" /tmp/cupti_check 2>&1 \
        | tee "$OUT/cupti.log"
    ;;
build)
    stage build
    extra=()
    [ -d .devdeps/share/cmake/nlohmann_json ] && extra+=(-Dnlohmann_json_DIR="$ROOT/.devdeps/share/cmake/nlohmann_json")
    cmake -S . -B build-gpu -DMAGPY_PYTHON="$PY" -DMAGPY_BUILD_KERNEL=OFF -DMAGPY_BUILD_TESTS=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="${MAGPY_GPU_CXXFLAGS:-}" "${extra[@]}" \
        2>&1 | tee "$OUT/build.log"
    timeout "${MAGPY_BUILD_TIMEOUT:-300}" cmake --build build-gpu -j"$JOBS" -- -k 2>&1 \
        | grep -v "^\[" | tee -a "$OUT/build.log" | grep -E "error|Error" | head -60
    ls -la build-gpu/python 2>/dev/null
    ;;
smoke)
    stage smoke
    PYTHONPATH="$ROOT/core/python:$ROOT/build-gpu/python" timeout 120 "$PY" tests/gpu/smoke.py 2>&1 \
        | tee "$OUT/smoke.log"
    ;;
test)
    # One pytest per test file, MAGPY_TEST_JOBS at a time: a crash stops one file, not the run.
    # No log capture (-p no:logging): inductor's DEBUG trace records filled the failing files'
    # reports and left out the assertion that failed.
    stage test
    logs=$OUT/pytest${MAGPY_TEST_BACKEND:+-$MAGPY_TEST_BACKEND}; mkdir -p "$logs"
    per=""; "$PY" -c "import pytest_timeout" 2>/dev/null && per="--timeout=${MAGPY_TEST_PER:-60}"
    (cd tests/python && ls ${MAGPY_TEST_FILES:-test_*.py} | grep -v "^test_report_schema.py$" \
     | OMP_NUM_THREADS=1 PYTHONPATH="$ROOT/core/python:$ROOT/build-gpu/python" xargs -P "${MAGPY_TEST_JOBS:-12}" -I{} \
       sh -c 'timeout "$1" "$2" -m pytest -q -rfEs -p no:cacheprovider -p no:logging $3 ${MAGPY_TEST_ARGS:-} {} > "$4/{}.log" 2>&1; \
              rc=$?; echo "{}: rc $rc: $(tail -1 "$4/{}.log")"' _ \
       "${MAGPY_TEST_TIMEOUT:-300}" "$PY" "$per" "$logs" \
     | sort > "$logs/report.txt")
    cat "$logs/report.txt"
    grep -h -E "^(FAILED|ERROR)" "$logs"/*.log | cut -c1-200 | head -${MAGPY_TEST_SHOW:-60}
    # The lease brings back only a few files: the summary (one line per file) and the failing
    # files' reports go into one, report.txt, and the per-file logs are dropped
    # (MAGPY_TEST_KEEP_LOGS=1 keeps them).
    for f in "$logs"/*.py.log; do
        grep -q -E "^(FAILED|ERROR)|Fatal Python error|Segmentation" "$f" || continue
        echo; echo "##### $(basename "$f" .log)"; tail -c "${MAGPY_TEST_FAIL_BYTES:-20000}" "$f"
    done >> "$logs/report.txt"
    [ "${MAGPY_TEST_KEEP_LOGS:-0}" = 1 ] || rm -f "$logs"/*.py.log
    ;;
bench)
    stage bench
    PYTHONPATH="$ROOT/core/python:$ROOT/build-gpu/python" timeout "${MAGPY_BENCH_TIMEOUT:-400}" \
        "$PY" bench/backends.py --device cuda ${MAGPY_BENCH_ARGS:-} --json "$OUT/gpu-bench.json" 2>&1 \
        | tee "$OUT/gpu-bench.txt"
    ;;
*) echo "unknown stage $s" >&2; exit 2 ;;
esac
done
