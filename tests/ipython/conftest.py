"""Shared helpers for the %%magpy tests: an in-process IPython shell with a recording display
publisher, and an HTML checker for the views' text/html."""

import html.parser
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
for p in (os.path.join(ROOT, "core", "python"), os.path.join(ROOT, "build", "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

from IPython.core.displaypub import DisplayPublisher  # noqa: E402
from IPython.testing.globalipapp import start_ipython  # noqa: E402

PROGRESS = "application/vnd.magpy.progress+json"
VIEW_KINDS = ("graphs", "refgraph", "guards", "breaks", "plan", "timings")


class RecordingPublisher(DisplayPublisher):
    """Records every display and update; `magpy_live` says how magpy may update it."""

    def __init__(self, live="threaded"):
        super().__init__()
        self.magpy_live = live
        self.messages = []

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False):
        self.messages.append({"time": time.monotonic(), "data": data,
                              "transient": dict(transient or {}), "update": update})

    def progress(self):
        return [m for m in self.messages if PROGRESS in m["data"]]

    def views(self):
        return [m for m in self.messages if PROGRESS not in m["data"]]

    def kinds(self):
        out = []
        for m in self.views():
            out += [k[len("application/vnd.magpy."):-len("+json")] for k in m["data"]
                    if k.startswith("application/vnd.magpy.")]
        return out

    def view(self, kind):
        mime = f"application/vnd.magpy.{kind}+json"
        found = [m["data"] for m in self.views() if mime in m["data"]]
        assert found, f"no {kind} view among {self.kinds()}"
        return found[-1]

    def clear(self):
        self.messages.clear()


def global_shell():
    """IPython's test shell (start_ipython returns it only on its first call)."""
    from IPython.core.interactiveshell import InteractiveShell
    return start_ipython() or InteractiveShell.instance()


@pytest.fixture
def ip():
    """The global test shell with magpy loaded; %magpy off and the display publisher restored
    after each test."""
    shell = global_shell()
    shell.run_cell("import torch").raise_error()
    shell.run_cell("%load_ext magpy").raise_error()
    # every test starts with no cached cells (the shell and its magics outlive a test)
    import magpy
    magpy.reset()
    shell.magics_manager.registry["MagpyMagics"]._cells.clear()
    pub = shell.display_pub
    offset = shell.InteractiveTB.tb_offset
    yield shell
    shell.run_cell("%magpy off")
    shell.display_pub = pub
    assert shell.InteractiveTB.tb_offset == offset, "the traceback offset was not put back"


@pytest.fixture
def rec(ip):
    r = RecordingPublisher()
    ip.display_pub = r
    return r


@pytest.fixture
def tracebacks(ip, monkeypatch):
    """The structured tracebacks the shell shows, as text."""
    shown = []
    orig = ip._showtraceback

    def record(etype, evalue, stb):
        shown.append("\n".join(stb))
        return orig(etype, evalue, stb)
    monkeypatch.setattr(ip, "_showtraceback", record)
    return shown


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class StrictHTML(html.parser.HTMLParser):
    """Balanced tags, no script, no event handler attributes, no javascript: URLs."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "iframe", "object", "embed", "foreignobject", "style", "link"):
            self.errors.append(f"forbidden <{tag}>")
        for name, value in attrs:
            if name.startswith("on"):
                self.errors.append(f"event handler {name} on <{tag}>")
            if value and "javascript:" in value.lower():
                self.errors.append(f"javascript: URL in <{tag} {name}>")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}>")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def check_html(text):
    """Parse text/html strictly; returns the text content. Fails on any error."""
    p = StrictHTML()
    p.feed(text)
    p.close()
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed tags: {p.stack[:5]}"
    return "".join(p.text)
