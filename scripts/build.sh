#!/usr/bin/env bash
# Configures and builds everything into build/ against Debian's /usr/bin/python3 (never PATH's).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${MAGPY_PYTHON:-/usr/bin/python3}"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMAGPY_PYTHON="$PYTHON" >/dev/null
cmake --build build -j"$(nproc)"
