"""Points Jupyter at the magpy kernel of *this* build, whatever else is installed.

Importing this module (conftest.py does, first) writes a temporary kernelspec named `magpy`
whose argv is the binary given by $MAGPY_KERNEL_BINARY (ctest sets it to the built target),
and puts it first on JUPYTER_PATH. History (IPYTHONDIR) and connection files also go to
temporary directories, so runs do not see each other or the user's files.
"""

import atexit
import json
import os
import shutil
import tempfile

KERNEL_NAME = "magpy"


def _setup():
    binary = os.environ.get("MAGPY_KERNEL_BINARY")
    if not binary or not os.access(binary, os.X_OK):
        raise RuntimeError(
            "MAGPY_KERNEL_BINARY must name the built magpy-kernel executable "
            "(ctest sets it; by hand: MAGPY_KERNEL_BINARY=build/kernel/magpy-kernel)")
    root = tempfile.mkdtemp(prefix="magpy-kernel-tests-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    spec_dir = os.path.join(root, "share", "kernels", KERNEL_NAME)
    os.makedirs(spec_dir)
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump({"argv": [binary, "-f", "{connection_file}"],
                   "display_name": "Python 3 (magpy, tests)", "language": "python",
                   "interrupt_mode": "signal"}, f)
    os.environ["JUPYTER_PATH"] = os.path.join(root, "share")
    os.environ["JUPYTER_DATA_DIR"] = os.path.join(root, "data")
    os.environ["JUPYTER_RUNTIME_DIR"] = os.path.join(root, "runtime")
    os.environ["IPYTHONDIR"] = os.path.join(root, "ipython")
    return root


ROOT = _setup()
