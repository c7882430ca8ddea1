"""%%magpy through real kernels, started by jupyter_client with a temporary kernelspec and this
checkout's PYTHONPATH: Debian's python3-ipykernel, and the magpy kernel of this build. The actual
display_data / update_display_data messages, MIME types, display_id reuse, the throttle, the
final update on error and on interrupt, and the views' HTML."""

import json
import os
import re
import sys
import time

import pytest

from conftest import PROGRESS, ROOT, VIEW_KINDS, check_html

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")

ANSI = re.compile(r"\x1b\[[0-9;]*m")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


MAGPY_KERNEL = os.environ.get("MAGPY_KERNEL_BINARY")


@pytest.fixture(scope="module", params=["ipykernel", "magpy"])
def kernel(request, tmp_path_factory):
    """The same tests against Debian's ipykernel and against the magpy kernel of this build
    ($MAGPY_KERNEL_BINARY, which ctest sets; skipped when it is not given)."""
    if request.param == "magpy" and not (MAGPY_KERNEL and os.access(MAGPY_KERNEL, os.X_OK)):
        pytest.skip("MAGPY_KERNEL_BINARY does not name a built magpy-kernel")
    base = tmp_path_factory.mktemp("jupyter")
    spec_dir = base / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    pythonpath = os.pathsep.join([os.path.join(ROOT, "core", "python"),
                                  os.path.join(ROOT, "build", "python")]
                                 + os.environ.get("PYTHONPATH", "").split(os.pathsep))
    argv = ([PYTHON, "-m", "ipykernel_launcher"] if request.param == "ipykernel"
            else [MAGPY_KERNEL])
    spec = {"argv": argv + ["-f", "{connection_file}"],
            "display_name": "Python 3 (magpy tests)", "language": "python",
            "interrupt_mode": "signal",
            "env": {"PYTHONPATH": pythonpath, "PYTHONNOUSERSITE": "1",
                    "IPYTHONDIR": str(base / "ipython")}}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "JUPYTER_RUNTIME_DIR")}
    os.environ["JUPYTER_PATH"] = str(base)
    os.environ["JUPYTER_RUNTIME_DIR"] = str(base / "runtime")
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        k = Kernel(km, kc)
        _, reply = k.execute("import sys, time, torch\n%load_ext magpy\nsys.executable")
        assert reply["content"]["status"] == "ok", reply["content"]
        yield k
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Kernel:
    def __init__(self, km, kc):
        self.km, self.kc = km, kc

    def execute(self, code, timeout=60, interrupt_when=None):
        """All IOPub messages of one request (up to idle) and its reply. interrupt_when(msgs)
        is asked after each message; when true, the kernel gets one SIGINT."""
        # stop_on_error=False: ipykernel would otherwise abort a request sent right after an
        # error reply (it aborts its queue until its loop runs again)
        msg_id = self.kc.execute(code, stop_on_error=False)
        msgs, interrupted = [], False
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no idle after {timeout} s; got {[m['msg_type'] for m in msgs]}"
            msg = self.kc.get_iopub_msg(timeout=left)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            msgs.append(msg)
            if interrupt_when and not interrupted and interrupt_when(msgs):
                self.km.interrupt_kernel()
                interrupted = True
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        while True:
            reply = self.kc.get_shell_msg(timeout=max(1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return msgs, reply

    def value(self, code):
        msgs, reply = self.execute(code)
        assert reply["content"]["status"] == "ok", ANSI.sub("", "\n".join(
            reply["content"].get("traceback", [])))
        results = [m for m in msgs if m["msg_type"] == "execute_result"]
        return results[-1]["content"]["data"]["text/plain"] if results else None


def progress_messages(msgs):
    return [m for m in msgs if m["msg_type"] in ("display_data", "update_display_data")
            and PROGRESS in m["content"]["data"]]


def view_messages(msgs):
    return [m for m in msgs if m["msg_type"] == "display_data"
            and PROGRESS not in m["content"]["data"]]


def test_display_messages_mime_types_and_display_id(kernel):
    eager = kernel.value("x = torch.arange(6.).reshape(2, 3); w = 2.0\n"
                         "(torch.relu(x - 1) * w).sum(0)")
    msgs, reply = kernel.execute("%%magpy\ny = torch.relu(x - 1) * w\ny.sum(0)")
    assert reply["content"]["status"] == "ok"
    (result,) = [m for m in msgs if m["msg_type"] == "execute_result"]
    assert result["content"]["data"]["text/plain"] == eager
    progress = progress_messages(msgs)
    first, updates = progress[0], progress[1:]
    assert first["msg_type"] == "display_data" and updates
    assert all(m["msg_type"] == "update_display_data" for m in updates)
    display_id = first["content"]["transient"]["display_id"]
    assert display_id and {m["content"]["transient"]["display_id"] for m in updates} == {display_id}
    assert updates[-1]["content"]["data"][PROGRESS]["phase"] == "done"
    for m in progress:
        assert set(m["content"]["data"]) == {PROGRESS, "text/html", "text/plain"}
        check_html(m["content"]["data"]["text/html"])
    # every live update left the kernel before the reply
    assert all(m["header"]["date"] <= reply["header"]["date"] for m in progress)
    views = view_messages(msgs)
    kinds = []
    for m in views:
        data = m["content"]["data"]
        (mime,) = [k for k in data if k.startswith("application/vnd.magpy.")]
        assert set(data) == {mime, "text/html", "text/plain"}
        assert isinstance(data[mime], dict)          # JSON, not a string
        kinds.append(data[mime]["kind"])
        check_html(data["text/html"])
    assert kinds == list(VIEW_KINDS)
    refgraph = views[1]["content"]["data"]
    assert refgraph["application/vnd.magpy.refgraph+json"]["layout"] in ("svg", "table")
    # the order of outputs: live view first, the views, then the cell's value
    order = [m["msg_type"] for m in msgs if m["msg_type"] != "status"]
    assert order.index("execute_result") > order.index("display_data")
    # a rerun replays, and says so, under a new display_id
    msgs, reply = kernel.execute("%%magpy\ny = torch.relu(x - 1) * w\ny.sum(0)")
    again = progress_messages(msgs)
    assert again[0]["content"]["transient"]["display_id"] != display_id
    assert again[-1]["content"]["data"][PROGRESS]["outcome"] == "replayed from the cache"
    (result,) = [m for m in msgs if m["msg_type"] == "execute_result"]
    assert result["content"]["data"]["text/plain"] == eager


def test_long_cell_updates_are_throttled(kernel):
    msgs, reply = kernel.execute("%%magpy\ntime.sleep(1.5)\n(x + 1).sum()")
    assert reply["content"]["status"] == "ok"
    progress = progress_messages(msgs)
    updates = [m for m in progress if m["msg_type"] == "update_display_data"]
    span = (progress[-1]["header"]["date"] - progress[0]["header"]["date"]).total_seconds()
    assert span >= 1.4
    assert 5 <= len(updates) <= span * 10 + 2, (len(updates), span)
    stamps = [m["header"]["date"] for m in progress[:-1]]
    gaps = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
    assert min(gaps) >= 0.095, gaps
    elapsed = [m["content"]["data"][PROGRESS]["elapsed_s"] for m in updates[:-1]]
    assert elapsed == sorted(elapsed) and elapsed[-1] > 1.0


def test_live_view_shows_a_break_and_a_graph_while_the_cell_still_runs(kernel):
    # an audit: the counts appeared only in the final update
    msgs, reply = kernel.execute("%%magpy\ny = (x * 2).relu()\nif y.sum() > 0:\n"
                                 "    y = y + 1\ntime.sleep(1.0)\ny.sum()")
    assert reply["content"]["status"] == "ok"
    progress = progress_messages(msgs)
    while_running = [m["content"]["data"][PROGRESS] for m in progress[:-1]
                     if m["content"]["data"][PROGRESS]["phase"] in ("capturing", "running")]
    seen = [d for d in while_running if d.get("breaks_seen") == 1 and d.get("graphs_seen") == 1]
    assert seen and seen[0]["elapsed_s"] < 0.9, while_running
    assert "so far 1 graph, 4 ops, 1 break" in progress[-2]["content"]["data"]["text/plain"]
    final = progress[-1]["content"]["data"][PROGRESS]
    assert final["phase"] == "done" and final["breaks"] == 1 and final["graphs"] == 1


def test_error_gives_a_final_update_and_a_normal_error_reply(kernel):
    msgs, reply = kernel.execute("%%magpy\ny = x * 2\nz = y / 0\nq = 1 / 0\nz")
    content = reply["content"]
    assert content["status"] == "error" and content["ename"] == "ZeroDivisionError"
    tb = ANSI.sub("", "\n".join(content["traceback"]))
    assert "----> 4 q = 1 / 0" in tb and "run_cell_magic" not in tb and "_ipython.py" not in tb
    (error,) = [m for m in msgs if m["msg_type"] == "error"]
    assert error["content"]["ename"] == "ZeroDivisionError"
    final = progress_messages(msgs)[-1]
    assert final["msg_type"] == "update_display_data"
    assert final["content"]["data"][PROGRESS]["phase"] == "error"
    assert "ZeroDivisionError" in final["content"]["data"]["text/plain"]
    # the kernel carries on, and an ordinary error shows its usual traceback afterwards
    msgs, reply = kernel.execute("def f():\n    raise KeyError('k')\nf()")
    assert reply["content"]["status"] == "error", reply["content"]
    assert "----> 3 f()" in ANSI.sub("", "\n".join(reply["content"]["traceback"]))


def test_fullgraph_break_error_reply_names_reason_hint_and_line(kernel):
    msgs, reply = kernel.execute("%%magpy --fullgraph\ny = x * 2\nif y.sum() > 0:\n"
                                 "    y = y + 1\ny")
    content = reply["content"]
    assert content["status"] == "error" and content["ename"] == "GraphBreakError"
    assert "[MB001]" in content["evalue"] and "hint:" in content["evalue"]
    assert re.search(r"at Cell In\[\d+\], line 3: if y\.sum\(\) > 0:", content["evalue"])
    breaks = [m for m in view_messages(msgs)
              if "application/vnd.magpy.breaks+json" in m["content"]["data"]]
    (b,) = breaks[0]["content"]["data"]["application/vnd.magpy.breaks+json"]["breaks"]
    assert b["lineno"] == 3


def test_interrupt_sends_the_final_update_and_leaves_no_tracer(kernel):
    def after_first_update(msgs):
        return any(m["msg_type"] == "update_display_data" for m in msgs)
    msgs, reply = kernel.execute("%%magpy\ny = x + 1\ntime.sleep(20)\ny",
                                 timeout=30, interrupt_when=after_first_update)
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    final = progress_messages(msgs)[-1]
    assert final["content"]["data"][PROGRESS]["phase"] == "interrupted"
    assert view_messages(msgs) == []
    assert kernel.value("(sys.gettrace(), sys.getprofile())") == "(None, None)"
    assert kernel.value("%%magpy --quiet\n(x + 2).sum()") == "tensor(27.)"


def test_usage_error_reply_names_the_option(kernel):
    msgs, reply = kernel.execute("%%magpy --backend nope\n1")
    content = reply["content"]
    assert content["status"] == "error" and content["ename"] == "UsageError"
    assert "'nope'" in content["evalue"]
    assert progress_messages(msgs) == []


def test_magpy_on_in_the_kernel_and_is_complete_still_works(kernel):
    msgs, reply = kernel.execute("%magpy on")
    assert reply["content"]["status"] == "ok"
    try:
        kernel.kc.is_complete("y = (x +")
        answer = kernel.kc.get_shell_msg(timeout=10)
        assert answer["content"]["status"] == "incomplete"
        msgs, reply = kernel.execute("y = x * 5\ny.sum()")
        assert reply["content"]["status"] == "ok"
        assert progress_messages(msgs)[-1]["content"]["data"][PROGRESS]["phase"] == "done"
        (result,) = [m for m in msgs if m["msg_type"] == "execute_result"]
        assert result["content"]["data"]["text/plain"] == "tensor(75.)"
    finally:
        msgs, reply = kernel.execute("%magpy off")
    assert reply["content"]["status"] == "ok"
    msgs, reply = kernel.execute("(x * 5).sum()")
    assert progress_messages(msgs) == [] and view_messages(msgs) == []


def test_a_valid_backend_option_reaches_the_engine(kernel):
    eager = kernel.value("x = torch.arange(6.).reshape(2, 3)\n(torch.tanh(x) * 3).sum(1)")
    msgs, reply = kernel.execute("%%magpy --backend torchscript\n(torch.tanh(x) * 3).sum(1)")
    assert reply["content"]["status"] == "ok"
    (result,) = [m for m in msgs if m["msg_type"] == "execute_result"]
    assert result["content"]["data"]["text/plain"] == eager
    (graphs,) = [m["content"]["data"]["application/vnd.magpy.graphs+json"]
                 for m in view_messages(msgs)
                 if "application/vnd.magpy.graphs+json" in m["content"]["data"]]
    assert graphs["graphs"] and {g["backend"] for g in graphs["graphs"]} == {"torchscript"}


def test_an_engine_failure_is_an_error_output_and_the_kernel_lives_on(kernel):
    """magpy.compile raising (an engine bug) is the cell's error; the engine's report failing
    after the cell ran keeps the cell's value and says why the views are missing."""
    kernel.value("x = torch.arange(6.).reshape(2, 3)\n"
                 "import magpy, magpy._ipython as _mi\n_compile, _report_of = magpy.compile, "
                 "_mi.report_of\ndef _broken(*a, **k):\n    raise RuntimeError('engine bug')\n"
                 "magpy.compile = _broken")
    try:
        msgs, reply = kernel.execute("%%magpy\n(x * 7).sum()")
        content = reply["content"]
        assert content["status"] == "error" and content["ename"] == "RuntimeError"
        assert content["evalue"] == "engine bug"
        assert [m for m in msgs if m["msg_type"] == "error"]
        kernel.value("magpy.compile = _compile\n_mi.report_of = _broken")
        msgs, reply = kernel.execute("%%magpy\n(x * 8).sum()")
        assert reply["content"]["status"] == "ok"
        (result,) = [m for m in msgs if m["msg_type"] == "execute_result"]
        assert result["content"]["data"]["text/plain"] == "tensor(120.)"
        final = progress_messages(msgs)[-1]["content"]["data"]
        assert final[PROGRESS]["phase"] == "done"
        assert any("report could not be read: engine bug" in n
                   for n in final[PROGRESS]["notes"]), final[PROGRESS]
        assert view_messages(msgs) == []
    finally:
        kernel.value("magpy.compile = _compile\n_mi.report_of = _report_of")
    assert kernel.value("%%magpy --quiet\n(x * 9).sum()") == "tensor(135.)"
