"""Jupyter comms through the real protocol: comms the kernel opens and the frontend opens,
messages both ways with binary buffers, comm_info, closing from either side, sends from a
thread, errors, interrupts, and ipywidgets (Debian's 6.0) end to end. Where Debian's
ipykernel has the same API, the same test runs against it too, so the magpy kernel is held to
what the standard kernel does; one test compares the two kernels' messages for a widget."""

import json
import os
import re
import time

import pytest

from kernel_client import Kernel

KERNELS = ["magpy", "python3"]  # python3: Debian's ipykernel, for comparison


@pytest.fixture(scope="module", params=KERNELS)
def kernel(request):
    k = Kernel(request.param)
    k.name = request.param
    yield k
    k.close()


@pytest.fixture(scope="module")
def magpy():
    k = Kernel()
    yield k
    k.close()


def ok(k, code):
    reply, msgs = k.execute(code)
    assert reply["status"] == "ok", (code, reply)
    return msgs


def value(k, expr):
    """The value of a JSON-able expression in the kernel."""
    msgs = ok(k, "import json as _json; print(_json.dumps(%s))" % expr)
    return json.loads(k.stdout(msgs))


def comm_info(k, target_name=None):
    msg_id = k.kc.comm_info(target_name)
    return k.reply(msg_id)["content"]["comms"]


def raw_execute(k, code):
    msg_id = k.kc.execute(code, allow_stdin=False)
    reply = k.reply(msg_id)["content"]
    assert reply["status"] == "ok", (code, reply)
    return msg_id, k.iopub_until_idle(msg_id)


def of_type(msgs, msg_type):
    return [m for m in msgs if m["msg_type"] == msg_type]


# --- comms the kernel opens --------------------------------------------------------------------

def test_kernel_opened_comm_round_trip(kernel):
    msg_id, msgs = raw_execute(kernel, (
        "from ipykernel.comm import Comm\n"
        "got, closed = [], []\n"
        "def on_msg(msg):\n"
        "    got.append((msg['content']['data'], [bytes(b).hex() for b in msg['buffers']]))\n"
        "    print('handled', msg['content']['data'])\n"
        "c = Comm(target_name='magpy.test', data={'hello': [1, 2]}, metadata={'m': 1})\n"
        "c.on_msg(on_msg)\n"
        "c.on_close(lambda msg: closed.append(msg['content']['data']))\n"
        "c.send({'x': 1}, buffers=[b'\\x00\\xff', memoryview(b'abc')])\n"))
    opens = of_type(msgs, "comm_open")
    assert len(opens) == 1
    comm_id = opens[0]["content"]["comm_id"]
    assert opens[0]["content"]["target_name"] == "magpy.test"
    assert opens[0]["content"]["data"] == {"hello": [1, 2]}
    assert opens[0]["metadata"] == {"m": 1}
    sent = of_type(msgs, "comm_msg")
    assert [m["content"] for m in sent] == [{"comm_id": comm_id, "data": {"x": 1}}]
    assert [bytes(b) for b in sent[0]["buffers"]] == [b"\x00\xff", b"abc"]
    assert all(m["parent_header"]["msg_id"] == msg_id for m in opens + sent)

    # comm_info lists it, under its target only
    assert comm_info(kernel)[comm_id] == {"target_name": "magpy.test"}
    assert comm_id in comm_info(kernel, "magpy.test")
    assert comm_id not in comm_info(kernel, "magpy.other")

    # the frontend sends: the callback gets data and buffers; its print belongs to the comm_msg
    msgs = kernel.send("comm_msg", {"comm_id": comm_id, "data": {"y": 2}},
                       buffers=[b"\x01\x02"])
    assert [m["content"]["execution_state"] for m in of_type(msgs, "status")] == ["busy",
                                                                                  "idle"]
    assert "handled {'y': 2}" in "".join(m["content"]["text"] for m in of_type(msgs, "stream"))
    assert value(kernel, "got") == [[{"y": 2}, ["0102"]]]

    # the frontend closes it: on_close runs, comm_info forgets it
    kernel.send("comm_close", {"comm_id": comm_id, "data": {"bye": True}})
    assert value(kernel, "closed") == [{"bye": True}]
    assert comm_id not in comm_info(kernel)
    # a message to a comm that is gone is dropped; the kernel goes on
    kernel.send("comm_msg", {"comm_id": comm_id, "data": {"late": 1}})
    assert value(kernel, "len(got)") == 1


def test_kernel_closes_its_comm(kernel):
    msg_id, msgs = raw_execute(kernel, (
        "from ipykernel.comm import Comm\n"
        "c2 = Comm(target_name='magpy.test2')\n"))
    comm_id = of_type(msgs, "comm_open")[0]["content"]["comm_id"]
    assert comm_id in comm_info(kernel)
    _, msgs = raw_execute(kernel, "c2.close(data={'done': 1})")
    assert [m["content"] for m in of_type(msgs, "comm_close")] == [
        {"comm_id": comm_id, "data": {"done": 1}}]
    assert comm_id not in comm_info(kernel)
    _, msgs = raw_execute(kernel, "c2.close(); c2.close()")  # closing twice sends nothing
    assert of_type(msgs, "comm_close") == []


def test_comm_sends_from_a_thread_arrive_in_order(kernel):
    _, msgs = raw_execute(kernel, (
        "import threading\n"
        "from ipykernel.comm import Comm\n"
        "c3 = Comm(target_name='magpy.thread')\n"
        "print('before')\n"
        "t = threading.Thread(target=lambda: [c3.send({'i': i}) for i in range(50)])\n"
        "t.start(); t.join()\n"
        "print('after')\n"))
    sent = [m["content"]["data"]["i"] for m in of_type(msgs, "comm_msg")]
    assert sent == list(range(50))
    if kernel.name == "magpy":
        # Prints keep their places among comm messages. (ipykernel sends 'before' after the
        # comm messages: its streams flush on a timer, its comms at once.)
        kinds = [m["msg_type"] for m in msgs if m["msg_type"] in ("stream", "comm_msg")]
        assert kinds[0] == "stream" and kinds[-1] == "stream"


# --- comms the frontend opens ------------------------------------------------------------------

ECHO_TARGET = (
    "echoes = []\n"
    "def on_open(comm, msg):\n"
    "    echoes.append(comm)\n"
    "    comm.send({'opened': msg['content']['data']})\n"
    "    comm.on_msg(lambda m: comm.send({'echo': m['content']['data']},\n"
    "                                    buffers=[bytes(b) for b in m['buffers']]))\n"
    "def refuse(comm, msg):\n"
    "    raise RuntimeError('this target refuses every comm')\n"
    "get_ipython().kernel.comm_manager.register_target('magpy.echo', on_open)\n"
    "get_ipython().kernel.comm_manager.register_target('magpy.refuse', refuse)\n")


def test_frontend_opened_comm(kernel):
    ok(kernel, ECHO_TARGET)
    comm_id = "frontend0%s" % kernel.name
    msgs = kernel.send("comm_open", {"comm_id": comm_id, "target_name": "magpy.echo",
                                     "data": {"a": 1}})
    assert [m["content"] for m in of_type(msgs, "comm_msg")] == [
        {"comm_id": comm_id, "data": {"opened": {"a": 1}}}]
    assert comm_info(kernel, "magpy.echo") == {comm_id: {"target_name": "magpy.echo"}}

    msgs = kernel.send("comm_msg", {"comm_id": comm_id, "data": {"b": 2}}, buffers=[b"xyz"])
    echoed = of_type(msgs, "comm_msg")
    assert [m["content"]["data"] for m in echoed] == [{"echo": {"b": 2}}]
    assert [bytes(b) for b in echoed[0]["buffers"]] == [b"xyz"]
    assert echoed[0]["parent_header"]["msg_type"] == "comm_msg"

    kernel.send("comm_close", {"comm_id": comm_id, "data": {}})
    assert comm_info(kernel, "magpy.echo") == {}
    # the same id may be opened again
    msgs = kernel.send("comm_open", {"comm_id": comm_id, "target_name": "magpy.echo",
                                     "data": {"again": True}})
    assert [m["content"]["data"] for m in of_type(msgs, "comm_msg")] == [
        {"opened": {"again": True}}]
    assert comm_id in comm_info(kernel)
    kernel.send("comm_close", {"comm_id": comm_id, "data": {}})


@pytest.mark.parametrize("target", ["magpy.refuse", "magpy.nobody"])
def test_frontend_comm_refused_is_closed(kernel, target):
    """A target whose handler raises, or no target at all: the kernel closes the comm, so the
    frontend is not left waiting, and goes on."""
    ok(kernel, ECHO_TARGET)
    comm_id = "refused%s%s" % (target.split(".")[1], kernel.name)
    msgs = kernel.send("comm_open", {"comm_id": comm_id, "target_name": target, "data": {}})
    assert [m["content"]["comm_id"] for m in of_type(msgs, "comm_close")] == [comm_id]
    assert comm_id not in comm_info(kernel)
    assert value(kernel, "1 + 1") == 2


# --- ipywidgets ----------------------------------------------------------------------------------

SLIDER = "import ipywidgets as w\ns = w.IntSlider(3, description='n')\ndisplay(s)\n"


def test_ipywidget_round_trip(kernel):
    msg_id, msgs = raw_execute(kernel, SLIDER)
    views = [m["content"]["data"] for m in of_type(msgs, "display_data")]
    assert len(views) == 1
    model_id = views[0]["application/vnd.jupyter.widget-view+json"]["model_id"]
    opened = {m["content"]["comm_id"]: m["content"] for m in of_type(msgs, "comm_open")}
    assert opened[model_id]["target_name"] == "jupyter.widget"
    assert opened[model_id]["data"]["_model_name"] == "IntSliderModel"
    assert opened[model_id]["data"]["value"] == 3
    assert set(opened) <= set(comm_info(kernel, "jupyter.widget"))

    # the frontend moves the slider (ipywidgets 6's "backbone" sync)
    kernel.send("comm_msg", {"comm_id": model_id,
                             "data": {"method": "backbone", "sync_data": {"value": 7}}})
    assert value(kernel, "s.value") == 7
    # the kernel sets it: one update to the frontend
    _, msgs = raw_execute(kernel, "s.value = 9")
    assert [m["content"]["data"] for m in of_type(msgs, "comm_msg")] == [
        {"method": "update", "state": {"value": 9}, "buffers": []}]
    # observers run for changes from the frontend
    ok(kernel, "seen = []\ns.observe(lambda ch: seen.append(ch['new']), 'value')")
    kernel.send("comm_msg", {"comm_id": model_id,
                             "data": {"method": "backbone", "sync_data": {"value": 4}}})
    assert value(kernel, "seen") == [4]

    _, msgs = raw_execute(kernel, "s.close()")
    assert [m["content"]["comm_id"] for m in of_type(msgs, "comm_close")] == [model_id]
    assert model_id not in comm_info(kernel)


def test_output_widget_knows_the_running_request(kernel):
    """ipywidgets' Output widget captures what is printed inside `with out:` by the msg_id
    of the request being run, which it reads from the kernel."""
    msg_id, msgs = raw_execute(kernel, (
        "import ipywidgets as w\n"
        "out = w.Output()\n"
        "with out:\n"
        "    inside = out.msg_id\n"
        "print(inside)\n"))
    printed = "".join(m["content"]["text"] for m in of_type(msgs, "stream")
                      if m["content"]["name"] == "stdout")
    assert printed.strip() == msg_id


def _normalised(msgs):
    """IOPub messages of one request with comm ids numbered by first appearance."""
    ids = {}

    def rename(text):
        return re.sub(r"[0-9a-f]{32}", lambda m: "ID%d" % ids.setdefault(m.group(), len(ids)),
                      text)

    out = []
    for m in msgs:
        if m["msg_type"] in ("status", "execute_input", "stream"):
            continue
        out.append((m["msg_type"], json.loads(rename(json.dumps(m["content"], sort_keys=True))),
                    len(m.get("buffers") or [])))
    return out


def test_widget_messages_match_ipykernel():
    """The same cells on both kernels give the same comm and display messages (ids aside)."""
    transcripts = {}
    for name in KERNELS:
        k = Kernel(name)
        try:
            cells = [SLIDER, "s.value = 5; s.description = 'm'",
                     "b = w.Button(description='go'); b.close(); s.close()"]
            transcripts[name] = [_normalised(raw_execute(k, c)[1]) for c in cells]
        finally:
            k.close()
    assert transcripts["magpy"] == transcripts["python3"]
    assert any(t == "comm_open" for t, _, _ in transcripts["magpy"][0])


# --- magpy-kernel specifics --------------------------------------------------------------------

def test_comm_package_api(magpy):
    """`comm.create_comm` and `comm.get_comm_manager` (what ipywidgets 8 and newer libraries
    use) are this kernel's."""
    msg_id, msgs = raw_execute(magpy, (
        "import comm\n"
        "c = comm.create_comm(target_name='magpy.pkg', data={'v': 1})\n"
        "assert comm.get_comm_manager() is get_ipython().kernel.comm_manager\n"
        "assert comm.get_comm_manager().get_comm(c.comm_id) is c\n"))
    opens = of_type(msgs, "comm_open")
    assert [(m["content"]["target_name"], m["content"]["data"]) for m in opens] == [
        ("magpy.pkg", {"v": 1})]
    assert opens[0]["content"]["comm_id"] in comm_info(magpy, "magpy.pkg")


def test_comm_with_an_id_xeus_cannot_hold(magpy):
    reply, msgs = magpy.execute("import comm\ncomm.create_comm(target_name='t', comm_id='x' * 60)")
    assert reply["status"] == "error"
    assert reply["ename"] == "ValueError"
    assert "1 to 55 bytes" in reply["evalue"]
    assert value(magpy, "len(comm.get_comm_manager().comms)") == len(comm_info(magpy))


def test_stop_on_error_aborts_only_execute_requests(kernel):
    """After a failing cell with stop_on_error, queued execute requests are aborted; a comm
    message and a completion queued with them are still handled (xeus 2.4.1 answered every
    queued message with an error and dropped comm messages)."""
    _, msgs = raw_execute(kernel, (
        "from ipykernel.comm import Comm\n"
        "queued = []\n"
        "c = Comm(target_name='magpy.queued')\n"
        "c.on_msg(lambda msg: queued.append(msg['content']['data']))\n"
        "queued_name_for_completion = 1\n"))
    comm_id = of_type(msgs, "comm_open")[0]["content"]["comm_id"]
    failing = kernel.kc.execute("import time; time.sleep(0.5); 1/0", stop_on_error=True)
    aborted = kernel.kc.execute("queued.append('ran')")
    msg = kernel.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"n": 1}})
    kernel.kc.session.send(kernel.kc.shell_channel.socket, msg)
    completion = kernel.kc.complete("queued_name_for_compl")
    replies = {}
    deadline = time.time() + 30
    while len(replies) < 3 and time.time() < deadline:
        r = kernel.kc.get_shell_msg(timeout=max(0.01, deadline - time.time()))
        replies[r["parent_header"].get("msg_id")] = r["content"]
    assert replies[failing]["status"] == "error" and replies[failing]["ename"] == "ZeroDivisionError"
    assert replies[aborted]["status"] == "aborted"
    assert replies[completion]["status"] == "ok"
    assert replies[completion]["matches"] == ["queued_name_for_completion"]
    kernel.drain()
    assert value(kernel, "queued") == [{"n": 1}]


def test_comm_data_json_lacks_is_made_as_ipykernel_makes_it(kernel):
    """Sets, ranges, numpy arrays and scalars, Fractions and datetimes: what ipykernel's
    session (jupyter_client's json_clean) sends, the same in both kernels."""
    _, msgs = raw_execute(kernel, (
        "import datetime, fractions, numpy as np\n"
        "from ipykernel.comm import Comm\n"
        "c = Comm(target_name='magpy.clean')\n"
        "utc = datetime.timezone.utc\n"
        "c.send({'set': {3}, 'frozen': frozenset(['a']), 'range': range(3),\n"
        "        'array': np.arange(4).reshape(2, 2), 'i64': np.int64(7), 'f32': np.float32(0.5),\n"
        "        'fraction': fractions.Fraction(3, 4),\n"
        "        'when': datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=utc),\n"
        "        'nested': [{'s': {1}}, (np.int32(2),)]})\n"))
    assert of_type(msgs, "comm_msg")[0]["content"]["data"] == {
        "set": [3], "frozen": ["a"], "range": [0, 1, 2], "array": [[0, 1], [2, 3]], "i64": 7,
        "f32": 0.5, "fraction": 0.75, "when": "2026-01-02T03:04:05Z",
        "nested": [{"s": [1]}, [2]]}


def test_bad_comm_data_and_buffers(magpy):
    """Values JSON and ipykernel lack become text (ipykernel refuses a date with a ValueError);
    a buffer that is not bytes-like is the caller's error."""
    _, msgs = raw_execute(magpy, (
        "import comm, datetime\n"
        "c = comm.create_comm(target_name='magpy.bad')\n"
        "c.send({'when': datetime.date(2026, 1, 2), 'nan': float('nan')})\n"))
    assert of_type(msgs, "comm_msg")[0]["content"]["data"] == {"when": "2026-01-02",
                                                               "nan": "nan"}
    reply, _ = magpy.execute("c.send({}, buffers=[12])")
    assert reply["status"] == "error" and reply["ename"] == "TypeError"
    assert "bytes-like" in reply["evalue"]


def test_interrupting_a_comm_handler(magpy):
    """A long widget callback can be interrupted; the kernel answers afterwards."""
    _, msgs = raw_execute(magpy, (
        "import comm, time\n"
        "slow = comm.create_comm(target_name='magpy.slow')\n"
        "slow.on_msg(lambda msg: time.sleep(60))\n"))
    comm_id = of_type(msgs, "comm_open")[0]["content"]["comm_id"]
    msg = magpy.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {}})
    magpy.kc.shell_channel.send(msg)
    while True:  # until the kernel is busy with it
        m = magpy.kc.get_iopub_msg(timeout=20)
        if (m["parent_header"].get("msg_id") == msg["header"]["msg_id"] and
                m["msg_type"] == "status"):
            break
    time.sleep(0.3)  # into the callback's sleep
    started = time.time()
    magpy.km.interrupt_kernel()
    magpy.iopub_until_idle(msg["header"]["msg_id"], timeout=20)
    assert time.time() - started < 10
    assert value(magpy, "'alive'") == "alive"


def test_widget_warning_goes_to_the_kernel_log_not_the_notebook(magpy):
    """ipywidgets logs through the IPython application's logger; like ipykernel, that goes to
    the kernel's terminal. (Its own stderr line still reaches the notebook, as in ipykernel.)"""
    _, msgs = raw_execute(magpy, "import ipywidgets as w\ndisplay(w.IntSlider())")
    stderr = "".join(m["content"]["text"] for m in of_type(msgs, "stream")
                     if m["content"]["name"] == "stderr")
    assert "Widget Javascript not detected" in stderr
    assert "WARNING" not in stderr



@pytest.mark.parametrize("length", [56, 60, 300])
def test_frontend_comm_ids_longer_than_xeus_holds_are_dropped(magpy, length):
    """xeus 2.4.1 copies comm ids into a 55-byte buffer unchecked; the kernel drops messages
    with longer ids (a line in its log) instead of corrupting memory."""
    ok(magpy, ECHO_TARGET)
    long_id = "z" * length
    for msg_type, content in (("comm_open", {"comm_id": long_id, "target_name": "magpy.echo",
                                             "data": {}}),
                              ("comm_msg", {"comm_id": long_id, "data": {}}),
                              ("comm_close", {"comm_id": long_id, "data": {}})):
        msg = magpy.kc.session.msg(msg_type, content)
        magpy.kc.shell_channel.send(msg)
    assert long_id not in comm_info(magpy)
    assert value(magpy, "len(echoes)") == value(magpy, "len(echoes)")  # alive, twice
    assert value(magpy, "[c.comm_id for c in echoes if len(c.comm_id) > 55]") == []


def test_comm_callback_errors_go_to_the_kernel_log(magpy):
    """A failing callback's traceback goes where ipykernel sends it (the kernel's terminal),
    not into the notebook; the kernel goes on."""
    _, msgs = raw_execute(magpy, (
        "import comm\n"
        "bad = comm.create_comm(target_name='magpy.bad_cb')\n"
        "bad.on_msg(lambda msg: 1 / 0)\n"))
    comm_id = of_type(msgs, "comm_open")[0]["content"]["comm_id"]
    msgs = magpy.send("comm_msg", {"comm_id": comm_id, "data": {}})
    assert of_type(msgs, "stream") == [], msgs
    msgs = ok(magpy, "print('next cell')")
    assert magpy.stdout(msgs) == "next cell\n"
    assert magpy.stdout(msgs, "stderr") == ""


def test_comms_survive_a_bare_find_spec():
    """importlib.util.find_spec (what some libraries run to probe for ipykernel) must not use
    up the kernel's adaptation of ipykernel.comm: ipywidgets still opens comms afterwards."""
    k = Kernel()
    try:
        reply, msgs = k.execute(
            "import importlib.util, sys\n"
            "assert 'ipykernel.comm' not in sys.modules\n"
            "spec = importlib.util.find_spec('ipykernel.comm')\n"
            "import ipywidgets\n"
            "s = ipywidgets.IntSlider(2)\n")
        assert reply["status"] == "ok", reply
        models = [c["data"].get("_model_name") for t, c in msgs if t == "comm_open"]
        assert "IntSliderModel" in models, msgs
    finally:
        k.close()
