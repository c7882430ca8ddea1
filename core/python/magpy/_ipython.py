"""`%load_ext magpy`: the %%magpy cell magic and the %magpy line magic, for any IPython-based
kernel (ipykernel, the magpy kernel) and the terminal.

    %%magpy [--backend B] [--fullgraph] [--dynamic] [--quiet]   run one cell under the engine
    %magpy on [same options] | off                               capture every cell, or stop
    %magpy explain                                               the views of the last cell again
    %magpy report FILE                                           write the last report (JSON)
    %magpy status                                                what is on, and the last cell

How a cell runs: its text becomes the body of a function named `<module>` over the notebook's
globals (every name the cell binds is declared global, so assignments stay notebook globals, and
tracebacks read like a normal cell's). The function is compiled once per cell text and options,
so running the cell again replays from the cache; a changed global recompiles and says why.

While it runs, one live view (a display_id, updated at most every LIVE_MIN_INTERVAL_S seconds,
with a final update on success, error or interrupt) says what the engine is doing; when it
ends, the rich views of magpy._views follow (unless --quiet).

[SECTION] index: options; cell to function; live view; tracebacks; the magics; loading.
"""

import ast
import builtins
import inspect
import io
import linecache
import os
import re
import shlex
import sys
import threading
import time
import tokenize
import types
import uuid
from collections import Counter, OrderedDict

from IPython.core.displaypub import DisplayPublisher
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from . import _views
from ._explain import _notebook_cell

USAGE = "usage: %%magpy [--backend B] [--fullgraph] [--dynamic] [--quiet]"
LINE_USAGE = ("usage: %magpy on [--backend B] [--fullgraph] [--dynamic] [--quiet] | %magpy off | "
              "%magpy explain | %magpy report FILE | %magpy status")
LIVE_MIN_INTERVAL_S = 0.1     # at most ~10 updates a second
LIVE_TICK_S = 0.2             # how often the elapsed time is refreshed while the cell runs
MAX_CACHED_CELLS = 128
DYNAMIC_NOTE = ("dynamic shapes are not supported yet: --dynamic is recorded, but shapes are "
                "still guarded exactly, so a new shape captures again")

# ----------------------------------------------------------------------------------------------
# [SECTION] options
# ----------------------------------------------------------------------------------------------


def parse_options(line, where="%%magpy"):
    """{'backend', 'fullgraph', 'dynamic', 'quiet'} from the magic's line; UsageError names the
    input that is wrong."""
    import magpy
    usage = LINE_USAGE if where.startswith("%magpy") else USAGE
    try:
        tokens = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"{where}: cannot read the options {line!r} ({e}).\n{usage}") from None
    opts = {"backend": "eager", "fullgraph": False, "dynamic": False, "quiet": False}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("--fullgraph", "--dynamic", "--quiet"):
            opts[tok[2:]] = True
        elif tok == "--backend" or tok.startswith("--backend="):
            if tok == "--backend":
                if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                    raise UsageError(f"{where}: --backend needs a name, as in `{where} "
                                     f"--backend eager` (got {line!r}).\n{usage}")
                i += 1
                opts["backend"] = tokens[i]
            else:
                opts["backend"] = tok.split("=", 1)[1]
        else:
            raise UsageError(f"{where}: unknown option {tok!r} in {line.strip()!r}.\n{usage}")
        i += 1
    available = magpy.backends()
    if opts["backend"] not in available:
        raise UsageError(f"{where}: unknown backend {opts['backend']!r} in {line.strip()!r}; "
                         f"the backends here are: {', '.join(available)}.\n{usage}")
    return opts


def dynamic_shapes_supported():
    """Whether the engine does dynamic shapes (rather than only recording dynamic=True)."""
    import magpy
    flag = getattr(magpy, "DYNAMIC_SHAPES_SUPPORTED", None)
    if flag is not None:
        return bool(flag)
    # magpy.mark_dynamic came with symbolic sizes; older engines only recorded the flag
    return hasattr(magpy, "mark_dynamic") and \
        "dynamic" in inspect.signature(magpy.compile).parameters


def format_options(opts):
    parts = [f"--backend {opts['backend']}"] if opts["backend"] != "eager" else []
    parts += [f"--{k}" for k in ("fullgraph", "dynamic", "quiet") if opts[k]]
    return " ".join(parts)


# ----------------------------------------------------------------------------------------------
# [SECTION] cell to function
# ----------------------------------------------------------------------------------------------

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _top_level_nodes(tree):
    """Nodes of the cell's own scope (not inside functions, lambdas, classes or
    comprehensions), plus the walrus targets of comprehensions, which bind in the cell."""
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPES):
            # the name it binds and its decorators/defaults run in the cell; the body does not
            for child in getattr(node, "decorator_list", []):
                stack.append(child)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                stack.extend(d for d in args.defaults + args.kw_defaults if d is not None)
            else:
                stack.extend(node.bases + [k.value for k in node.keywords])
            continue
        if isinstance(node, _COMPREHENSIONS):
            for sub in ast.walk(node):
                if isinstance(sub, ast.NamedExpr):
                    yield sub
                    yield sub.target
            stack.append(node.generators[0].iter)   # only the first iterable runs in the cell
            continue
        stack.extend(ast.iter_child_nodes(node))


def cell_bindings(tree):
    """Names the cell binds in its own scope (they are notebook globals)."""
    names = set()
    for node in _top_level_nodes(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                if a.name == "*":
                    continue
                names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, ast.Global):
            names.update(node.names)
    return names


def _syntax_error(msg, filename, node, source_lines):
    line = node.lineno
    text = source_lines[line - 1] if 0 < line <= len(source_lines) else None
    return SyntaxError(msg, (filename, line, (node.col_offset or 0) + 1, text))


def _ends_with_semicolon(source):
    """True when the cell's last statement ends with ';' (IPython then shows no result)."""
    try:
        toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT,
                                  tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT)]
    except (tokenize.TokenError, SyntaxError):
        return False
    return bool(toks) and toks[-1].type == tokenize.OP and toks[-1].string == ";"


def _blank_head(text):
    """How many lines at the start of `text` are blank."""
    n = 0
    for line in text.splitlines():
        if line.strip():
            break
        n += 1
    return n


def build_cell_function(python_source, filename, line_offset, user_ns, display_lines=()):
    """A function `<module>()` that runs the cell over user_ns and returns its last expression.

    python_source: the cell after IPython's transforms (magics, !cmd), line for line.
    line_offset: lines above the code in what the user sees (1 for the `%%magpy` line), so that
    tracebacks and breaks name the cell's own line numbers. Raises SyntaxError on the cell's line
    for what a cell cannot do (or cannot do under magpy).
    """
    display_lines = list(display_lines)
    try:
        tree = ast.parse(python_source, filename=filename)
    except SyntaxError as e:
        if e.lineno is not None:
            e.lineno += line_offset
            if e.end_lineno is not None:
                e.end_lineno += line_offset
            if 0 < e.lineno <= len(display_lines):
                e.text = display_lines[e.lineno - 1]
        e.filename = filename
        raise
    ast.increment_lineno(tree, line_offset)
    for node in _top_level_nodes(tree):
        if isinstance(node, ast.Return):
            raise _syntax_error("'return' outside function", filename, node, display_lines)
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            raise _syntax_error("'yield' outside function", filename, node, display_lines)
        if isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)):
            raise _syntax_error("%%magpy cannot run top-level await/async code; run this cell "
                                "without %%magpy, or put the async code in a function",
                                filename, node, display_lines)
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            raise _syntax_error("%%magpy cannot run `from ... import *`; run the import in a "
                                "cell of its own, without %%magpy", filename, node,
                                display_lines)
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            raise _syntax_error("%%magpy cannot run `from __future__ import`; run it in a cell "
                                "of its own, without %%magpy", filename, node, display_lines)
    names = cell_bindings(tree)
    _module_scope_calls(tree)
    body = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Global):
            continue                      # declared once, below
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            # `x: int = 1` binds a global; a global cannot carry an annotation in a function,
            # so the annotation is stored in the notebook's __annotations__ as at module level
            # (a review probe: a bare `a: float` was dropped)
            if stmt.value is not None:
                body.append(ast.copy_location(
                    ast.Assign(targets=[stmt.target], value=stmt.value), stmt))
            if stmt.simple:
                note = ast.parse("globals().setdefault('__annotations__', {})"
                                 f"[{stmt.target.id!r}] = None").body[0]
                for part in ast.walk(note):  # at the annotation's line, not the template's
                    ast.copy_location(part, stmt)
                note.value = stmt.annotation
                body.append(note)
            continue
        body.append(stmt)
    if body and isinstance(body[-1], ast.Expr) and not _ends_with_semicolon(python_source):
        body[-1] = ast.copy_location(ast.Return(value=body[-1].value), body[-1])
    if not body:
        body = [ast.Pass()]
    if names:
        body.insert(0, ast.Global(names=sorted(names)))
    fn = ast.FunctionDef(name="<module>",
                         args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                                            kw_defaults=[], kwarg=None, defaults=[]),
                         body=body, decorator_list=[], returns=None, type_comment=None)
    fn.lineno, fn.col_offset = 1, 0
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    code = compile(module, filename, "exec", dont_inherit=True)
    fcode = next(c for c in code.co_consts if hasattr(c, "co_code"))
    user_ns.setdefault(SCOPE_CALL, module_scope_call)
    user_ns.setdefault(SCOPE_MAGIC, module_scope_magic)
    return types.FunctionType(fcode, user_ns, "<module>")


def _module_scope_calls(tree):
    """In a cell's own scope, locals are the notebook's globals: `exec(src)`, `eval(src)`,
    `locals()`, `vars()` and `dir()` become calls through `module_scope_call`, which gives the builtins
    `globals()` explicitly (they would read and write the function's locals, and lose new
    names) and calls anything else of that name as it is (a user's own `def eval(model)`).
    An audit: `exec('y = 1')` then `y` was a NameError under %%magpy."""
    for node in _top_level_nodes(tree):
        if _is_line_magic_call(node):
            # `%time y = f(x)`: a magic that runs code in its caller's scope (needs_local_scope)
            # is run from the notebook's own (a review probe: `y` was bound in the cell
            # function's frame and lost)
            here = ast.Call(func=ast.Name(id="globals", ctx=ast.Load()), args=[], keywords=[])
            node.args = [here] + node.args
            node.func = ast.copy_location(ast.Name(id=SCOPE_MAGIC, ctx=ast.Load()), node.func)
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or \
                node.func.id not in _MODULE_SCOPE_BUILTINS or node.keywords or \
                any(isinstance(a, ast.Starred) for a in node.args):
            continue
        here = ast.Call(func=ast.Name(id="globals", ctx=ast.Load()), args=[], keywords=[])
        node.args = [node.func, here] + node.args
        node.func = ast.copy_location(ast.Name(id=SCOPE_CALL, ctx=ast.Load()), node.func)


_MODULE_SCOPE_BUILTINS = {"exec": 1, "eval": 1, "locals": 0, "vars": 0, "dir": 0}
SCOPE_CALL = "__magpy_module_scope_call__"
SCOPE_MAGIC = "__magpy_module_scope_magic__"


def _is_line_magic_call(node):
    """`get_ipython().run_line_magic('name', 'line')`, as IPython writes `%name line`."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and
            node.func.attr == "run_line_magic" and isinstance(node.func.value, ast.Call) and
            isinstance(node.func.value.func, ast.Name) and
            node.func.value.func.id == "get_ipython" and len(node.args) == 2 and
            not node.keywords and all(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                      for a in node.args))


def module_scope_magic(here, name, line):
    """`%name line` from a %%magpy cell's own scope: run by a frame whose locals are the
    notebook's globals, as at the top of a plain cell (IPython hands that frame's locals to
    magics that run code, and expands $names from it)."""
    code = compile(f"get_ipython().run_line_magic({name!r}, {line!r})", "<magic>", "eval")
    return eval(code, here)


def module_scope_call(fn, here, *args):
    """`fn(*args)` from a %%magpy cell's own scope (see _module_scope_calls)."""
    name = getattr(fn, "__name__", None)
    if fn is getattr(builtins, name or "", None) and \
            len(args) == _MODULE_SCOPE_BUILTINS.get(name, -1):
        if name in ("exec", "eval"):
            return fn(args[0], here)
        if name == "dir":  # the names of the module's scope, sorted
            return sorted(here)
        return here  # locals(), vars() at module level
    return fn(*args)


class CellProgram:
    """One cell text under one set of options: its function, compiled callable and names."""

    def __init__(self, fn, compiled, filename, display_source, line_offset):
        self.fn = fn
        self.compiled = compiled
        self.filename = filename
        self.display_source = display_source
        self.line_offset = line_offset
        self.label = "this cell"
        self.runs = 0


# ----------------------------------------------------------------------------------------------
# [SECTION] live view
# ----------------------------------------------------------------------------------------------


def live_mode(shell):
    """How live updates are sent through this shell's display publisher:

    'threaded'  a ticker thread refreshes the view while the cell runs (the publisher is safe
                to call from another thread: ipykernel's is, and a kernel can declare it by
                setting `display_pub.magpy_live = "threaded"`);
    'main'      updates only from the main thread, at the phases Python can see;
    'final'     one display at the end (a terminal prints every update, so it gets the end only).
    """
    pub = shell.display_pub
    declared = getattr(pub, "magpy_live", None)
    if declared in ("threaded", "main", "final"):
        return declared
    if type(pub).__module__.split(".")[0] == "ipykernel":
        return "threaded"
    if type(pub) is DisplayPublisher:
        return "final"
    return "main"


class LiveView:
    """One display, updated in place: at most one update per min_interval seconds (the newest
    state wins), and a final update that is always sent."""

    def __init__(self, publish, min_interval=LIVE_MIN_INTERVAL_S, clock=time.monotonic,
                 mode="main"):
        self._publish = publish               # publish(bundle, display_id, update)
        self._min_interval = min_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last_sent = None
        self._pending = None
        self._finished = False
        self.mode = mode
        self.display_id = f"magpy-{uuid.uuid4().hex}"
        self.updates_sent = 0

    def show(self, bundle):
        if self.mode == "final":
            return
        with self._lock:
            self._publish(bundle, self.display_id, False)
            self._last_sent = self._clock()

    def update(self, bundle):
        """Throttled: sent now if the last send is old enough, else kept as the pending state."""
        if self.mode == "final":
            return
        with self._lock:
            if self._finished:
                return
            now = self._clock()
            if self._last_sent is not None and now - self._last_sent < self._min_interval:
                self._pending = bundle
                return
            self._send_locked(bundle, now)

    def flush(self):
        """Send the pending state if the interval allows (called by the ticker)."""
        with self._lock:
            if self._pending is not None and not self._finished and (
                    self._last_sent is None or
                    self._clock() - self._last_sent >= self._min_interval):
                self._send_locked(self._pending, self._clock())

    def finish(self, bundle):
        """The final state, whatever the throttle says; nothing is sent after it."""
        # A ticker stuck in a publish must not keep the final state back for long.
        locked = self._lock.acquire(timeout=1.0)
        try:
            self._finished = True
            self._pending = None
            if self.mode == "final":
                self._publish(bundle, self.display_id, False)
                return
            self._publish(bundle, self.display_id, self._last_sent is not None)
            self._last_sent = self._clock()
            self.updates_sent += 1
        finally:
            if locked:
                self._lock.release()

    def _send_locked(self, bundle, now):
        self._pending = None
        self._publish(bundle, self.display_id, True)
        self._last_sent = now
        self.updates_sent += 1


class _Ticker:
    """Refreshes the live view's elapsed time from a daemon thread while the cell runs."""

    def __init__(self, live, make_bundle, period=LIVE_TICK_S):
        self._live, self._make, self._period = live, make_bundle, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="magpy-live-view", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self):
        while not self._stop.wait(self._period):
            try:
                self._live.update(self._make())
            except Exception:        # a view must never disturb the user's cell
                return


# ----------------------------------------------------------------------------------------------
# [SECTION] tracebacks: show the cell's frames, as for a cell run without %%magpy
# ----------------------------------------------------------------------------------------------

def _frames_above_run_code(frame):
    """How many frames from IPython's run_code down to (not including) `frame`, or None."""
    n, f = 0, frame.f_back
    while f is not None:
        n += 1
        if f.f_code.co_name == "run_code" and f.f_code.co_filename.endswith("interactiveshell.py"):
            return n
        f = f.f_back
    return None


def _tb_entries_before(tb, code):
    n = 0
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return n
        n += 1
        tb = tb.tb_next
    return None


_BREAK_AT = re.compile(r"^(?P<indent>\s*)at (?P<file>.+):(?P<line>\d+) in (?P<func>.+)$", re.M)
_BREAK_HEAD = re.compile(r"^\[(?P<id>MB\d+)\]\s*(?P<reason>.*)$", re.M)
_BREAK_HINT = re.compile(r"^\s*hint:\s*(?P<hint>.*)$", re.M)


def parse_break_message(message):
    """The break of a GraphBreakError message: {reason_id, reason, hint, filename, lineno,
    function}, or None."""
    head = _BREAK_HEAD.search(message)
    if not head:
        return None
    at = _BREAK_AT.search(message)
    hint = _BREAK_HINT.search(message)
    return {"reason_id": head.group("id"), "reason": head.group("reason").strip(),
            "hint": hint.group("hint").strip() if hint else "",
            "filename": at.group("file") if at else "",
            "lineno": int(at.group("line")) if at else 0,
            "function": at.group("func").strip() if at else ""}


# ----------------------------------------------------------------------------------------------
# [SECTION] the magics
# ----------------------------------------------------------------------------------------------


def report_of(compiled):
    import magpy
    return magpy.explain(compiled).report


def _multiset_new(after, before):
    left = Counter(before)
    out = []
    for x in after:
        if left[x]:
            left[x] -= 1
        else:
            out.append(x)
    return out


def run_summary(before, after, wall_ns, first_run):
    """What this run did, from the report before and after it."""
    b = before or {}

    def delta(key):
        return after.get(key, 0) - b.get(key, 0)

    reasons = _multiset_new(after.get("recompile_reasons", []), b.get("recompile_reasons", []))
    old_breaks = {(x["reason_id"], x["filename"], x["lineno"]) for x in b.get("breaks", [])}
    new_breaks = [x for x in after.get("breaks", [])
                  if (x["reason_id"], x["filename"], x["lineno"]) not in old_breaks]
    if delta("captures") > 0:
        outcome = "recaptured" if reasons else \
            ("captured" if first_run or not b else "captured again")
    elif delta("cache_hits") > 0:
        outcome = "replayed from the cache"
    elif delta("eager_calls") > 0:
        outcome = "ran eagerly"
    else:
        outcome = "ran"
    return {"wall_ns": int(wall_ns), "outcome": outcome, "recompile_reasons": reasons,
            "new_breaks": new_breaks, "captures": delta("captures"),
            "cache_hits": delta("cache_hits"), "eager_calls": delta("eager_calls")}


@magics_class
class MagpyMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self._cells = OrderedDict()   # (cell text, options) -> CellProgram
        self.last = None              # the compiled callable of the last %%magpy cell
        self.last_program = None
        self.last_run = {}
        self._auto_line = None        # options of %magpy on, or None when off
        self._auto_pending = None     # the body the input transformer just wrapped
        self._running = False
        self._cells_running = 0       # between pre_run_cell and post_run_cell
        self._saved_tb_offset = None

    # -- %%magpy ------------------------------------------------------------------------------

    @cell_magic("magpy")
    def magpy_cell(self, line, cell):
        """Run the cell under magpy: its code is captured, and a rerun replays the graph.

        %%magpy [--backend B] [--fullgraph] [--dynamic] [--quiet]
        """
        __tracebackhide__ = True
        auto = self._auto_pending is not None and cell == self._auto_pending
        self._auto_pending = None
        opts = parse_options(line)
        if not cell.strip():
            return None
        header = "" if auto else ("%%magpy " + line.strip()).rstrip() + "\n"
        display_source = header + cell
        # --quiet changes what is shown, not what runs: the same cached program serves both
        key = (cell, auto, opts["backend"], opts["fullgraph"], opts["dynamic"])
        program = self._cells.get(key)
        notes = []
        if opts["dynamic"] and not dynamic_shapes_supported():
            notes.append(DYNAMIC_NOTE)
        first_run = program is None
        if program is None:
            try:
                program = self._compile_cell(cell, display_source, 0 if auto else 1, opts)
            except SyntaxError:
                self._show_syntax_error_alone()
                raise
            self._cells[key] = program
            while len(self._cells) > MAX_CACHED_CELLS:
                self._cells.popitem(last=False)
        else:
            self._cells.move_to_end(key)
            program.display_source = display_source
        self._register_source(program)
        self.last, self.last_program = program.compiled, program
        return self._run(program, opts, first_run, notes)

    def _compile_cell(self, cell, display_source, line_offset, opts):
        __tracebackhide__ = True
        import magpy
        shell = self.shell
        # magics and !cmd inside the cell become Python, line for line
        self._running = True
        try:
            python_source = shell.transform_cell(cell)
        finally:
            self._running = False
        # IPython drops the cell's leading blank lines; put them back so that line numbers are
        # those the user sees (a review probe: every view was off by their count)
        lost = _blank_head(cell) - _blank_head(python_source)
        if lost > 0:
            python_source = "\n" * lost + python_source
        filename = shell.compile.cache(display_source, shell.execution_count)
        fn = build_cell_function(python_source, filename, line_offset, shell.user_ns,
                                 display_source.splitlines())
        kwargs = {"backend": opts["backend"], "fullgraph": opts["fullgraph"]}
        if opts["dynamic"] and "dynamic" in inspect.signature(magpy.compile).parameters:
            kwargs["dynamic"] = True
        compiled = magpy.compile(fn, **kwargs)
        return CellProgram(fn, compiled, filename, display_source, line_offset)

    def _register_source(self, program):
        """Tracebacks and views name the cell as IPython does (Cell In[n]) for the latest run."""
        shell = self.shell
        count = shell.execution_count
        fmap = getattr(shell.compile, "_filename_map", None)
        if isinstance(fmap, dict):
            fmap[program.filename] = count
        entry = (len(program.display_source), None,
                 [l + "\n" for l in program.display_source.splitlines()], program.filename)
        linecache.cache[program.filename] = entry
        if hasattr(linecache, "_ipython_cache"):
            linecache._ipython_cache[program.filename] = entry
        program.label = f"Cell In[{count}]"

    def _context(self, program, report, run):
        labels, lines = {}, {}
        extra = [run["error_break"]] if run.get("error_break") else []
        for b in report.get("breaks", []) + extra:
            f = b.get("filename", "")
            if f and f != program.filename:
                if cell := _notebook_cell(f, self.shell):
                    labels[f] = cell
                text = linecache.getline(f, b.get("lineno", 0))
                if text:
                    lines.setdefault(f, {})[b["lineno"]] = text.rstrip("\n")
        for g in _views._with_callees(report).get("graphs", []):
            for op in g.get("ops", []):  # ops traced into functions of other cells
                f = op.get("filename", "")
                if f and f != program.filename and (cell := _notebook_cell(f, self.shell)):
                    labels[f] = cell
        return {"label": program.label, "filename": program.filename,
                "source": program.display_source, "file_labels": labels, "file_lines": lines,
                "run": run}

    def _run(self, program, opts, first_run, notes):
        __tracebackhide__ = True
        import _magpy
        shell = self.shell
        quiet = opts["quiet"]
        mode = "final" if quiet else live_mode(shell)
        live = LiveView(self._publish_live, mode=mode)
        state = {"phase": "capturing" if first_run else "running", "label": program.label,
                 "backend": opts["backend"], "fullgraph": opts["fullgraph"],
                 "dynamic": opts["dynamic"], "elapsed_s": 0.0, "notes": list(notes)}
        before = None
        if not first_run:
            try:
                before = report_of(program.compiled)
            except Exception:
                before = None
        t0 = time.perf_counter()

        def snapshot():
            s = dict(state)
            s["elapsed_s"] = time.perf_counter() - t0
            return _views.progress_view(s)

        # What captures still running found so far (graph_found, break_found): one frame per
        # capture (they nest: a compiled callee, a resumed segment), replaced by the capture's
        # own totals when it ends
        running = []

        def seen(key, n):
            state[key] = state.get(key, 0) + n
            if running:
                running[-1][key] = running[-1].get(key, 0) + n

        def on_progress(event, info):
            # The engine's progress hook: called as it captures and compiles (any compiled
            # function the cell runs), outside tracing.
            if event == "capture":
                state["phase"] = "capturing"
                state["captures_seen"] = state.get("captures_seen", 0) + 1
                running.append({})
            elif event == "break_found":
                seen("breaks_seen", int(info.get("breaks", 1)))
            elif event == "graph_found":
                seen("graphs_seen", 1)
                seen("ops_seen", int(info.get("ops", 0)))
            elif event == "captured":
                provisional = running.pop() if running else {}
                for key, field in (("graphs_seen", "ok"), ("ops_seen", "ops"),
                                   ("breaks_seen", "breaks")):
                    state[key] = (state.get(key, 0) - provisional.get(key, 0) +
                                  int(info.get(field, 0)))
            elif event == "compile":
                state["phase"] = "compiling"
            elif event == "compiled":
                state["phase"] = "running"
            live.update(snapshot())

        ticker = None
        error = None
        try:
            # Inside the try: an interrupt that lands here still gets the final update and
            # resets _running (which `%magpy on` checks).
            if not quiet:
                live.show(snapshot())
                if mode == "threaded":
                    ticker = _Ticker(live, snapshot).start()
                _magpy._set_progress_hook(on_progress)
            program.runs += 1
            self._running = True
            result = program.compiled()
        except BaseException as e:
            error = e
            raise
        finally:
            self._running = False
            if not quiet:
                _magpy._set_progress_hook(None)
            wall_ns = int((time.perf_counter() - t0) * 1e9)
            if ticker is not None:
                ticker.stop()
            self._finish(program, opts, state, live, before, first_run, wall_ns, error, quiet)
        return result

    def _finish(self, program, opts, state, live, before, first_run, wall_ns, error, quiet):
        """Final live update, rich views, and a traceback that starts at the cell. Never raises
        (except a second KeyboardInterrupt): the user's result or exception comes first."""
        try:
            self._finish_views(program, opts, state, live, before, first_run, wall_ns, error,
                               quiet)
        except Exception as e:
            print(f"magpy: could not show the views of {program.label}: "
                  f"{type(e).__name__}: {e}", file=sys.stderr)
        if error is not None:
            try:
                self._point_traceback_at_cell(error, program)
            except Exception:
                pass

    def _finish_views(self, program, opts, state, live, before, first_run, wall_ns, error,
                      quiet):
        import magpy
        try:
            after = report_of(program.compiled)
        except Exception as e:          # an engine failure must not hide the user's result
            after = None
            state["notes"].append(f"the engine's report could not be read: {e}")
        run = run_summary(before, after, wall_ns, first_run) if after else \
            {"wall_ns": wall_ns, "outcome": "", "recompile_reasons": []}
        if isinstance(error, magpy.GraphBreakError):
            brk = parse_break_message(str(error))
            if brk:
                run["error_break"] = brk
                self._rewrite_break_message(error, program)
        if error is not None:
            text = str(error).strip()
            run["error"] = type(error).__name__ + (f": {text.splitlines()[0]}" if text else "")
        self.last_run = run
        state.update(phase="done" if error is None else
                     ("interrupted" if isinstance(error, KeyboardInterrupt) else "error"),
                     elapsed_s=wall_ns / 1e9, outcome=run.get("outcome", ""),
                     recompile_reasons=run.get("recompile_reasons", []))
        if after:
            # counted as the views below count: with the callees that ran compiled on their own
            whole = _views._with_callees(after)
            state.update(graphs=after["graph_count"] + len(whole["graphs"]) - len(after["graphs"]),
                         breaks=after["break_count"] + len(whole["breaks"]) - len(after["breaks"]),
                         ops=sum(g["op_count"] for g in whole["graphs"]),
                         capture_ns=after["timings_ns"]["capture"],
                         compile_ns=after["timings_ns"]["compile"])
        if error is not None:
            state["error"] = run["error"]
        if not quiet:
            live.finish(_views.progress_view(state))
            if after is not None and not isinstance(error, KeyboardInterrupt):
                self._publish_views(after, self._context(program, after, run))

    def _rewrite_break_message(self, error, program):
        """`at <file>:3 in <module>` becomes `at Cell In[5], line 3: <the line>`."""
        msg = str(error)
        lines = program.display_source.splitlines()

        def repl(m):
            if m.group("file") != program.filename:
                return m.group(0)
            n = int(m.group("line"))
            text = lines[n - 1].strip() if 0 < n <= len(lines) else ""
            return f"{m.group('indent')}at {program.label}, line {n}: {text}"
        new = _BREAK_AT.sub(repl, msg)
        if new != msg:
            error.args = (new,)

    def _point_traceback_at_cell(self, error, program):
        """Skip IPython's and magpy's frames above the cell, as for a cell run without %%magpy;
        the offset is put back after the cell (post_run_cell)."""
        tb = error.__traceback__
        if tb is None:
            return
        above = _frames_above_run_code(tb.tb_frame)
        inside = _tb_entries_before(tb, program.fn.__code__)
        if above is None or inside is None:
            return
        itb = self.shell.InteractiveTB
        if self._saved_tb_offset is None:
            self._saved_tb_offset = itb.tb_offset
        # run_code's own frame is skipped by IPython's usual offset of 1
        itb.tb_offset = above + inside - 1 + self._saved_tb_offset

    def _pre_run_cell(self, *args):
        self._cells_running += 1

    def _post_run_cell(self, *args):
        self._cells_running = max(0, self._cells_running - 1)
        self._restore_tb_offset()
        self._restore_showsyntaxerror()

    def _show_syntax_error_alone(self):
        """The SyntaxError about to be shown is shown as a plain cell's is: its line, without
        the frames of IPython's magic call and of magpy (11 of them; a review probe). IPython
        shows every frame of a SyntaxError raised by running code; this cell never ran."""
        shell = self.shell
        show = type(shell).showsyntaxerror

        def alone(filename=None, running_compiled_code=False):
            self._restore_showsyntaxerror()
            return show(shell, filename, False)
        shell.showsyntaxerror = alone

    def _restore_showsyntaxerror(self):
        vars(self.shell).pop("showsyntaxerror", None)

    def _restore_tb_offset(self):
        if self._saved_tb_offset is not None:
            self.shell.InteractiveTB.tb_offset = self._saved_tb_offset
            self._saved_tb_offset = None

    def _publish_live(self, bundle, display_id, update):
        self.shell.display_pub.publish(data=bundle, metadata={},
                                       transient={"display_id": display_id}, update=update)

    def _publish_views(self, report, ctx, kinds=_views.KINDS):
        for kind in kinds:
            try:
                bundle = _views.build_view(kind, report, ctx)
            except Exception as e:       # a broken view must not fail the user's cell
                bundle = {"text/plain": f"magpy: the {kind} view failed: {type(e).__name__}: {e}"}
            self.shell.display_pub.publish(data=bundle, metadata={})

    # -- %magpy on | off | explain | report FILE | status ----------------------------------------

    @line_magic("magpy")
    def magpy_line(self, line):
        """%magpy on [options] | off | explain | report FILE | status"""
        try:
            words = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"%magpy: cannot read {line!r} ({e}).\n{LINE_USAGE}") from None
        if not words:
            return self._status()
        cmd, rest = words[0], words[1:]
        if cmd == "on":
            opts = parse_options(" ".join(shlex.quote(w) for w in rest), where="%magpy on")
            self._auto_line = format_options(opts)
            self._install_transformer()
            print(f"magpy: every cell now runs under %%magpy (backend {opts['backend']}"
                  f"{', fullgraph' if opts['fullgraph'] else ''}"
                  f"{', dynamic' if opts['dynamic'] else ''}"
                  f"{', quiet' if opts['quiet'] else ''}); cells that start with % or ! run as "
                  "usual; `%magpy off` stops")
            return None
        if cmd == "off":
            if rest:
                raise UsageError(f"%magpy off takes no arguments (got {' '.join(rest)!r}).")
            was_on = self._auto_line is not None
            self._auto_line = None
            self._remove_transformer()
            print("magpy: cells run as usual again" if was_on else "magpy: was not on")
            return None
        if cmd == "explain":
            if rest:
                raise UsageError(f"%magpy explain takes no arguments (got {' '.join(rest)!r}).")
            program = self._need_last("explain")
            report = report_of(program.compiled)
            self._publish_views(report, self._context(program, report, self.last_run))
            return None
        if cmd == "report":
            if len(rest) != 1:
                raise UsageError(f"%magpy report needs one file name (got {line.strip()!r}); "
                                 "for example `%magpy report magpy-report.json`.")
            return self._write_report(rest[0])
        if cmd == "status":
            return self._status()
        raise UsageError(f"%magpy: unknown command {cmd!r} in {line.strip()!r}.\n{LINE_USAGE}")

    def _need_last(self, what):
        if self.last_program is None:
            raise UsageError(f"%magpy {what}: no %%magpy cell has run yet; run a cell that starts "
                             "with %%magpy (or turn on `%magpy on`) first.")
        return self.last_program

    def _write_report(self, path):
        import magpy
        program = self._need_last("report")
        text = magpy.explain(program.compiled).to_json()
        path = os.path.expanduser(path)  # `~/r.json`, as %save and %%writefile take it
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
                f.write("\n")
        except OSError as e:
            why = e.strerror or str(e)
            raise UsageError(f"%magpy report: cannot write the report to {path!r}: {why}. "
                             "Choose a file in a folder that exists and is writable.") from None
        print(f"magpy: wrote the report of {program.label} to {path}")
        return None

    def _status(self):
        on = (f"on ({self._auto_line or 'backend eager'})" if self._auto_line is not None
              else "off")
        last = self.last_program.label if self.last_program else "none yet"
        print(f"magpy: capture of every cell is {on}; last %%magpy cell: {last}; "
              f"{len(self._cells)} cells cached\n{LINE_USAGE}")
        return None

    @line_magic("magpy_explain")
    def magpy_explain(self, line):
        """The Explanation of the last %%magpy cell (magpy.explain of its compiled callable)."""
        import magpy
        if self.last is None:
            print("no %%magpy cell has run yet")
            return None
        return magpy.explain(self.last)

    # -- %magpy on: an input transformer that puts %%magpy in front of each cell ---------------

    def _auto_transform(self, lines):
        # Only the cell itself: not code that a running cell hands to transform_cell
        # (%time, %timeit, %prun ...), which IPython transforms after pre_run_cell.
        if self._running or self._auto_line is None or self._cells_running:
            return lines
        first = next((l for l in lines if l.strip()), None)
        if first is None or first.lstrip().startswith(("%", "!")):
            return lines
        self._auto_pending = "".join(lines)
        return [f"%%magpy {self._auto_line}".rstrip() + "\n"] + list(lines)

    # check_complete (is_complete requests) must not see cells turned into cell magics
    _auto_transform.has_side_effects = True

    def _install_transformer(self):
        cleanup = self.shell.input_transformers_cleanup
        if self._auto_transform not in cleanup:
            cleanup.append(self._auto_transform)

    def _remove_transformer(self):
        cleanup = self.shell.input_transformers_cleanup
        while self._auto_transform in cleanup:
            cleanup.remove(self._auto_transform)


# ----------------------------------------------------------------------------------------------
# [SECTION] loading
# ----------------------------------------------------------------------------------------------

def load(ipython):
    old = ipython.magics_manager.registry.get("MagpyMagics")
    if old is not None:                 # %reload_ext: drop the old instance's hooks
        old._remove_transformer()
        for event, fn in (("pre_run_cell", old._pre_run_cell),
                          ("post_run_cell", old._post_run_cell)):
            try:
                ipython.events.unregister(event, fn)
            except ValueError:
                pass
    magics = MagpyMagics(ipython)
    if old is not None:                 # keep what the user turned on and ran
        magics._auto_line = old._auto_line
        magics.last, magics.last_program, magics.last_run = old.last, old.last_program, \
            old.last_run
        if magics._auto_line is not None:
            magics._install_transformer()
    ipython.register_magics(magics)
    ipython.events.register("pre_run_cell", magics._pre_run_cell)
    ipython.events.register("post_run_cell", magics._post_run_cell)
    return magics
