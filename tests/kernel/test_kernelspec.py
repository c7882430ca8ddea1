"""The kernelspec this build makes (build/share/jupyter/kernels/magpy, from
share/jupyter/kernels/magpy/kernel.json.in), installed the way scripts/install-kernel.sh installs
it (KernelSpecManager.install_kernel_spec), but under a temporary prefix: `jupyter kernelspec
list`, `jupyter console --kernel magpy` and a `jupyter notebook` server find it and run code
with it."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest
import requests
from jupyter_client.kernelspec import KernelSpecManager

BINARY = os.path.abspath(os.environ["MAGPY_KERNEL_BINARY"])
BUILT_SPEC = os.path.join(os.path.dirname(os.path.dirname(BINARY)), "share", "jupyter", "kernels",
                          "magpy")
JUPYTER = [sys.executable, "-m"]


@pytest.fixture(scope="module")
def jupyter_env(tmp_path_factory):
    """An environment whose Jupyter sees only the installed magpy spec (and Debian's own)."""
    prefix = tmp_path_factory.mktemp("prefix")
    # installed by the README's own command, into a prefix (an audit: no test ran it)
    build = os.path.dirname(os.path.dirname(BINARY))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([os.path.join(root, "scripts", "install-kernel.sh")],
                         env={**os.environ, "MAGPY_KERNEL_PREFIX": str(prefix),
                              "MAGPY_BUILD_DIR": build},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "jupyter finds kernel 'magpy'" in run.stdout, run.stdout
    installed = os.path.join(str(prefix), "share", "jupyter", "kernels", "magpy")
    env = dict(os.environ)
    env["JUPYTER_PATH"] = os.path.join(str(prefix), "share", "jupyter")
    for key, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTER_CONFIG_DIR", "config"),
                     ("JUPYTER_DATA_DIR", "data"), ("IPYTHONDIR", "ipython")):
        env[key] = str(prefix / sub)
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return installed, env


def test_the_built_kernelspec():
    with open(os.path.join(BUILT_SPEC, "kernel.json")) as f:
        spec = json.load(f)
    assert spec["display_name"] == "Python 3 (magpy)"
    assert spec["argv"] == [BINARY, "-f", "{connection_file}"]
    assert spec["language"] == "python" and spec["interrupt_mode"] == "signal"


def test_jupyter_kernelspec_list_finds_it(jupyter_env):
    installed, env = jupyter_env
    out = subprocess.run(JUPYTER + ["jupyter_client.kernelspecapp", "list", "--json"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)["kernelspecs"]["magpy"]
    assert found["resource_dir"] == installed
    assert found["spec"]["display_name"] == "Python 3 (magpy)"
    assert found["spec"]["argv"][0] == BINARY


def test_jupyter_console_runs_code_with_it(jupyter_env):
    _, env = jupyter_env
    out = subprocess.run(JUPYTER + ["jupyter_console", "--kernel", "magpy", "--simple-prompt"],
                         input="print(6 * 7)\nimport sys; sys.executable\n", env=env,
                         capture_output=True, text=True, timeout=120)
    assert "magpy kernel" in out.stdout, out.stdout + out.stderr  # the kernel's banner
    assert "42" in out.stdout and "Out[2]: '/usr/bin/python3'" in out.stdout, out.stdout


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _execute_over_websocket(url, code, timeout=60):
    """Runs `code` through the notebook server's kernel websocket, as a browser would: the
    execute_reply's status and the stdout text."""
    from tornado.websocket import websocket_connect

    async def run():
        ws = await websocket_connect(url)
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False}}))
        status, text, idle = None, "", False
        while status is None or not idle:
            raw = await asyncio.wait_for(ws.read_message(), timeout)
            assert raw is not None, "the websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_reply":
                status = msg["content"]["status"]
            elif msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        ws.close()
        return status, text

    return asyncio.run(run())


def test_a_notebook_server_lists_starts_and_runs_it(jupyter_env, tmp_path):
    _, env = jupyter_env
    port, token = _free_port(), uuid.uuid4().hex
    log = tmp_path / "notebook.log"
    server = subprocess.Popen(
        JUPYTER + ["notebook", "--no-browser", "--port=%d" % port, "--port-retries=0",
                   "--ip=127.0.0.1", "--NotebookApp.token=" + token,
                   "--notebook-dir=" + str(tmp_path)]
        + (["--allow-root"] if os.geteuid() == 0 else []),
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    base = "http://127.0.0.1:%d/api" % port
    auth = {"Authorization": "token " + token}
    try:
        deadline = time.time() + 60
        while True:
            try:
                specs = requests.get(base + "/kernelspecs", headers=auth, timeout=5)
                break
            except requests.ConnectionError:
                assert server.poll() is None, "jupyter notebook exited: " + log.read_text()
                assert time.time() < deadline, "jupyter notebook did not start"
                time.sleep(0.2)
        assert specs.status_code == 200
        magpy = specs.json()["kernelspecs"]["magpy"]
        assert magpy["spec"]["display_name"] == "Python 3 (magpy)"
        kernel = requests.post(base + "/kernels", headers=auth, json={"name": "magpy"},
                               timeout=60).json()
        assert kernel["name"] == "magpy"
        ws_url = "ws://127.0.0.1:%d/api/kernels/%s/channels?token=%s" % (port, kernel["id"],
                                                                         token)
        status, text = _execute_over_websocket(ws_url, "import torch\nprint(torch.ones(2).sum())")
        assert (status, text) == ("ok", "tensor(2.)\n")
        assert requests.delete(base + "/kernels/" + kernel["id"], headers=auth,
                               timeout=30).status_code == 204
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
