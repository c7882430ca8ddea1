#!/usr/bin/env bash
# Installs every system package the project needs, from Debian 12's archive only.
# Idempotent: packages already present are skipped, and apt is not touched when none is missing.
set -euo pipefail

PACKAGES=(
    # build
    build-essential cmake pkg-config git
    # the embedded interpreter and the engine's dependencies
    python3 python3.11-dev python3-torch libtorch-dev pybind11-dev python3-pybind11
    nlohmann-json3-dev
    # tests
    googletest libgtest-dev python3-pytest python3-numpy python3-jsonschema
    # notebook side (IPython extension, peers)
    python3-ipython python3-ipykernel python3-jupyter-client
    # the %%magpy RefGraph view lays out its SVG with graphviz's dot
    graphviz
    # real models for tests and benchmarks
    python3-torchvision
    # the Jupyter kernel (kernel/): xeus and its headers, the Jupyter tools that find, run and
    # test it, and the peer kernels of bench/kernel_latency.py
    xeus-dev xtl-dev cppzmq-dev libzmq3-dev
    jupyter-core jupyter-client jupyter-console jupyter-notebook python3-notebook
    python3-jupyter-kernel-test python3-nbclient python3-nbformat python3-nbconvert
    jupyter-nbconvert python3-matplotlib python3-matplotlib-inline xpython
    # tests/kernel/test_kernelspec.py talks to a notebook server over HTTP and its websocket
    python3-requests python3-tornado
    # comms in the kernel (the `comm` package), and ipywidgets with its classic-notebook
    # frontend (tests/kernel/test_comms.py drives widgets through the protocol)
    python3-comm python3-ipywidgets python3-widgetsnbextension
)

missing=()
for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#PACKAGES[@]} packages present"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install-deps: missing packages (${missing[*]}) and not root; run as root or install sudo" >&2
        exit 1
    fi
fi

echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
