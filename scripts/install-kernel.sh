#!/usr/bin/env bash
# Installs the magpy Jupyter kernel system-wide: the kernelspec "magpy" ("Python 3 (magpy)")
# goes to /usr/local/share/jupyter/kernels/magpy, where `jupyter kernelspec list`,
# `jupyter console --kernel magpy`, `jupyter notebook` and nbclient find it. Builds the kernel
# (build/kernel/magpy-kernel) and the magpy module first if needed, and installs magpy.pth so
# that %%magpy can import magpy. Run as root or with sudo. Idempotent.
# MAGPY_KERNEL_PREFIX=DIR installs the kernelspec under DIR/share/jupyter instead (no root
# needed, nothing else touched; Jupyter finds it with JUPYTER_PATH=DIR/share/jupyter, and
# %%magpy needs magpy on PYTHONPATH): what the tests do.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${MAGPY_PYTHON:-/usr/bin/python3}"
BUILD="${MAGPY_BUILD_DIR:-build}"  # the build tree the kernelspec will point into
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Build (incremental: nothing to do when up to date). The kernel option is forced on, in case
# an older build/ was configured without it.
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMAGPY_PYTHON="$PYTHON" \
      -DMAGPY_BUILD_KERNEL=ON >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target magpy-kernel _magpy
SPEC="$BUILD/share/jupyter/kernels/magpy"
if [ ! -x "$BUILD/kernel/magpy-kernel" ] || [ ! -f "$SPEC/kernel.json" ]; then
    echo "install-kernel: the build did not produce $BUILD/kernel/magpy-kernel and $SPEC" >&2
    exit 1
fi

PREFIX="${MAGPY_KERNEL_PREFIX:-}"
if [ -n "$PREFIX" ]; then
    SUDO=""
    export JUPYTER_PATH="$PREFIX/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
else
    # %%magpy imports magpy: the same .pth file as scripts/main-job.sh.
    SITE="$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')"
    $SUDO mkdir -p "$SITE"
    $SUDO cp "$BUILD/magpy.pth" "$SITE/magpy.pth"
fi

$SUDO "$PYTHON" - "$SPEC" "$PREFIX" <<'PY'
import sys
from jupyter_client.kernelspec import KernelSpecManager
prefix = sys.argv[2] or None
path = KernelSpecManager().install_kernel_spec(sys.argv[1], kernel_name="magpy", user=False,
                                               prefix=prefix)
print("install-kernel: installed the kernelspec at", path)
PY
# Check that Jupyter now finds it, with the binary it names.
"$PYTHON" - <<'PY'
import os
from jupyter_client.kernelspec import KernelSpecManager
spec = KernelSpecManager().get_kernel_spec("magpy")
assert os.access(spec.argv[0], os.X_OK), spec.argv
print("install-kernel: jupyter finds kernel 'magpy' (%s): %s" % (spec.display_name, spec.argv[0]))
PY
