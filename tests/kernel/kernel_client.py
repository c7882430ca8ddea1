"""A small synchronous client for protocol tests: runs a request and collects every IOPub
message that belongs to it, in order, up to its `idle`."""

import queue
import time

from jupyter_client.manager import start_new_kernel

import kernel_env

TIMEOUT = 30


class Kernel:
    def __init__(self, kernel_name=kernel_env.KERNEL_NAME):
        """The magpy kernel under test, or another installed kernel to compare with
        ("python3": Debian's ipykernel on /usr/bin/python3)."""
        self.km, self.kc = start_new_kernel(kernel_name=kernel_name, startup_timeout=90)
        self.drain()

    def close(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)

    def drain(self, seconds=0.2):
        """Forgets messages of earlier requests."""
        for get in (self.kc.get_iopub_msg, self.kc.get_shell_msg, self.kc.get_stdin_msg):
            while True:
                try:
                    get(timeout=seconds)
                except queue.Empty:
                    break

    def reply(self, msg_id, timeout=TIMEOUT, channel="shell"):
        get = getattr(self.kc, "get_%s_msg" % channel)
        deadline = time.time() + timeout
        while True:
            msg = get(timeout=max(0.01, deadline - time.time()))
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg

    def iopub_until_idle(self, msg_id, timeout=TIMEOUT):
        msgs = []
        deadline = time.time() + timeout
        while True:
            msg = self.kc.get_iopub_msg(timeout=max(0.01, deadline - time.time()))
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            msgs.append(msg)
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return msgs

    def execute(self, code, timeout=TIMEOUT, **kwargs):
        """(reply content, [(msg_type, content)] of IOPub, busy and idle included)."""
        kwargs.setdefault("allow_stdin", False)
        msg_id = self.kc.execute(code, **kwargs)
        reply = self.reply(msg_id, timeout)
        msgs = self.iopub_until_idle(msg_id, timeout)
        return reply["content"], [(m["msg_type"], m["content"]) for m in msgs]

    def send(self, msg_type, content, buffers=None, timeout=TIMEOUT):
        """Sends a shell message that has no reply (comm_open, comm_msg, comm_close) and
        returns its IOPub messages up to `idle`, whole."""
        msg = self.kc.session.msg(msg_type, content)
        self.kc.session.send(self.kc.shell_channel.socket, msg, buffers=buffers or [])
        return self.iopub_until_idle(msg["header"]["msg_id"], timeout)

    def outputs(self, msgs):
        return [(t, c) for t, c in msgs if t not in ("status", "execute_input")]

    def stdout(self, msgs, name="stdout"):
        return "".join(c["text"] for t, c in msgs if t == "stream" and c["name"] == name)
