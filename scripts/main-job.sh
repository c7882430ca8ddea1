#!/usr/bin/env bash
# The main job: install system packages, build, make `import magpy` work for Debian's python3
# from any directory, run the quick-start demo (a compiled model and its explanation), install
# the Jupyter kernel, and run the quick-start notebook with it (build/notebooks/quickstart.ipynb
# and .html).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${MAGPY_PYTHON:-/usr/bin/python3}"
scripts/install-deps.sh
scripts/build.sh
# A .pth file in Debian's site directory points at the package sources and the built module.
SITE="$("$PYTHON" -c 'import site; print(site.getsitepackages()[0])')"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO mkdir -p "$SITE"
$SUDO cp build/magpy.pth "$SITE/magpy.pth"
echo "main-job: installed $SITE/magpy.pth"
(cd / && "$PYTHON" -c "import magpy; print('main-job: import magpy OK from /, version', magpy.__version__)")
"$PYTHON" scripts/quickstart.py

# The Jupyter kernel, system-wide, then the quick-start notebook end to end with it.
scripts/install-kernel.sh
scripts/run-notebook.sh notebooks/quickstart.ipynb build/notebooks magpy
