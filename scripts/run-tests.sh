#!/usr/bin/env bash
# Every test: installs what is missing, builds, then runs ctest (GoogleTest units and the
# pytest suites). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
