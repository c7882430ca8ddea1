#!/usr/bin/env bash
# Runs a notebook end to end with a Jupyter kernel and exports it to HTML:
#   scripts/run-notebook.sh NOTEBOOK OUT_DIR [KERNEL_NAME]
# leaves OUT_DIR/<name>.ipynb (executed, with its outputs) and OUT_DIR/<name>.html. The kernel
# is the installed kernelspec KERNEL_NAME (default: magpy). Used by scripts/main-job.sh for the
# quick-start notebook, and by tests/kernel/test_notebooks.py.
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    echo "usage: scripts/run-notebook.sh NOTEBOOK OUT_DIR [KERNEL_NAME]" >&2
    exit 2
fi
NOTEBOOK="$1"
OUT="$2"
KERNEL="${3:-magpy}"
PYTHON="${MAGPY_PYTHON:-/usr/bin/python3}"
if [ ! -f "$NOTEBOOK" ]; then
    echo "run-notebook: no notebook at $NOTEBOOK" >&2
    exit 2
fi
NAME="$(basename "$NOTEBOOK" .ipynb)"
mkdir -p "$OUT"
"$PYTHON" -m nbconvert --to notebook --execute --ExecutePreprocessor.kernel_name="$KERNEL" \
    --ExecutePreprocessor.timeout=600 --output-dir "$OUT" --output "$NAME.ipynb" "$NOTEBOOK"
"$PYTHON" -m nbconvert --to html --output-dir "$OUT" --output "$NAME.html" "$OUT/$NAME.ipynb"
echo "run-notebook: executed notebook at $OUT/$NAME.ipynb, HTML at $OUT/$NAME.html"
