"""Python side of the magpy kernel: the IPython shell and the hooks that route its output to C++.

This file is compiled into the `magpy-kernel` executable (kernel/CMakeLists.txt embeds it) and
runs inside its embedded CPython. The C++ side (kernel/src) owns the protocol, the sockets,
signals and stdin; this module owns what is easier in Python: IPython's InteractiveShell
(magics, `!cmd`, `obj?`, `_`, In/Out, display machinery, history) and turning its results into
plain dicts. Every function the C++ side calls returns JSON-able values and never raises for a
user's mistake: user errors come back as data.

`_magpy_kernel` is the embedded C++ module (kernel/src/bindings.cpp).
"""

import asyncio
import builtins
import getpass
import io
import os
import platform
import signal
import sys

import _magpy_kernel as _k

KERNEL_VERSION = "0.1.0"
_shell = None


# --- streams -----------------------------------------------------------------------------------

class _BinaryStream(io.RawIOBase):
    """`sys.stdout.buffer`: bytes go to the C++ buffer as they are; invalid UTF-8 is replaced
    when the text is published, so it can never break a message."""

    def __init__(self, name):
        super().__init__()
        self._name = name

    def writable(self):
        return True

    def write(self, data):
        data = bytes(data)
        _k.write_stream_bytes(self._name, data)
        return len(data)

    def flush(self):
        _k.flush_streams()


class KernelStream(io.TextIOBase):
    """sys.stdout / sys.stderr inside the kernel. Writes are cheap appends to a C++ buffer that
    any thread may call; C++ coalesces them and publishes by time and size, and before any
    other output, so text keeps its place among displays."""

    def __init__(self, name, fd):
        super().__init__()
        self._name = name
        self._fd = fd
        self.buffer = _BinaryStream(name)

    @property
    def name(self):
        return "<%s>" % self._name

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "replace"

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        # With fd capture on, fds 1 and 2 lead to the same place (a pipe read by C++).
        if self._fd is None:
            raise io.UnsupportedOperation("fileno: this kernel stream has no file descriptor")
        return self._fd

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        _k.write_stream(self._name, text)
        return len(text)

    def flush(self):
        _k.flush_streams()


def install_streams(fds_captured):
    sys.stdout = KernelStream("stdout", 1 if fds_captured else None)
    sys.stderr = KernelStream("stderr", 2 if fds_captured else None)
    os.register_at_fork(after_in_child=_streams_of_a_forked_child)


def _streams_of_a_forked_child():
    """A forked child (multiprocessing's workers, a DataLoader's) has no kernel threads or
    sockets: its sys.stdout and sys.stderr write to fds 1 and 2, which lead to the kernel's
    fd readers (published in the cell that runs) or to the terminal when they are not
    captured."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        try:
            raw = io.FileIO(fd, "w", closefd=False)
        except OSError:
            continue
        setattr(sys, name, io.TextIOWrapper(raw, encoding="utf-8", errors="replace",
                                            line_buffering=True, write_through=True))


# --- stdin -------------------------------------------------------------------------------------

def _no_stdin_error(called):
    from IPython.core.error import StdinNotImplementedError
    return StdinNotImplementedError(
        f"{called} was called, but this frontend does not support input requests "
        "(the execute request had allow_stdin=False). Give the value another way, "
        "for example as a variable in the cell.")


def _prompt_text(prompt):
    # What the frontend shows: str(prompt), with characters JSON cannot carry (lone
    # surrogates) as U+FFFD, as ipykernel sends them
    text = str(prompt)
    return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)


def kernel_input(prompt=""):
    """builtins.input: asks the frontend over the stdin channel."""
    if not _k.stdin_allowed():
        raise _no_stdin_error("input()")
    return _k.request_input(_prompt_text(prompt), False)


def kernel_getpass(prompt="Password: ", stream=None):
    """getpass.getpass: like input(), with the frontend told to hide what is typed."""
    if not _k.stdin_allowed():
        raise _no_stdin_error("getpass()")
    return _k.request_input(_prompt_text(prompt), True)


# --- comms -------------------------------------------------------------------------------------
# Jupyter comms (ipywidgets, and anything built on the `comm` package) live here, in a
# subclass of the `comm` package's CommManager, as in ipykernel. The C++ side mirrors them in
# xeus's registry, hands the frontend's comm messages to the manager, and sends ours on IOPub
# from any thread, in order with other output (kernel/src/comms.hpp, [Note: comms]).

_comm_types = None    # (KernelComm, KernelCommManager), made on first use
_comm_manager = None


def _comm_classes():
    global _comm_types
    if _comm_types is not None:
        return _comm_types
    from comm.base_comm import BaseComm, CommManager

    class KernelComm(BaseComm):
        """A comm of this kernel: `comm.create_comm()` and ipykernel's `Comm` make these."""

        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            content = dict(data={} if data is None else data, comm_id=self.comm_id, **keys)
            _k.publish_comm(msg_type, content, metadata or {}, buffers)

        @property
        def kernel(self):
            # ipywidgets sends state only through a comm that has a kernel.
            return getattr(_shell, "kernel", None)

    class KernelCommManager(CommManager):
        """The `comm` package's manager, mirrored in xeus's registry (comm_info, routing)."""

        def register_target(self, target_name, f):
            super().register_target(target_name, f)
            _k.comm_add_target(str(target_name))

        def register_comm(self, comm):
            _k.comm_add(str(comm.comm_id), str(comm.target_name))  # checks the id first
            return super().register_comm(comm)

        def unregister_comm(self, comm):
            try:
                super().unregister_comm(comm)
            finally:
                _k.comm_remove(str(comm.comm_id))

    _comm_types = (KernelComm, KernelCommManager)
    return _comm_types


def comm_manager():
    """The kernel's comm manager (`comm.get_comm_manager()`, `get_ipython().kernel.comm_manager`)."""
    global _comm_manager
    if _comm_manager is None:
        _comm_manager = _comm_classes()[1]()
        _k.comm_set_handler(_on_comm_request)
    return _comm_manager


def create_comm(*args, **kwargs):
    """`comm.create_comm()` in this kernel."""
    return _comm_classes()[0](*args, **kwargs)


def _on_comm_request(msg_type, msg):
    """comm_open, comm_msg or comm_close from the frontend (called by C++ on the main thread)."""
    getattr(comm_manager(), msg_type)(None, None, msg)


class KernelHandle:
    """`get_ipython().kernel`: where libraries look for a Jupyter kernel's comms (ipywidgets
    registers its targets on `comm_manager`) and for the request being run (the Output
    widget routes output by its msg_id)."""

    def __init__(self, shell):
        self.shell = shell

    @property
    def comm_manager(self):
        return comm_manager()

    @property
    def _parent_header(self):
        return {"header": _k.current_parent()}


def _patch_comm_package(module):
    module.create_comm = create_comm
    module.get_comm_manager = comm_manager


def _patch_ipykernel_comm(module):
    # ipykernel before 6.18 has its own Comm, which needs ipykernel's kernel object; ipywidgets
    # 6 and 7 build that Comm (and type-check against ipykernel.comm.Comm by name).
    kernel_comm, kernel_manager = _comm_classes()
    module.Comm = kernel_comm
    module.CommManager = kernel_manager


class _AfterImport:
    """A sys.meta_path finder that patches a module right after its first import, so the
    kernel can adapt libraries (ipykernel.comm, comm) without importing them at start-up."""

    def __init__(self, patches):
        self._patches = dict(patches)  # module name -> function(module)

    def find_spec(self, name, path=None, target=None):
        patch = self._patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            self._patches.pop(name, None)  # once executed (a bare find_spec executes nothing)
            try:
                patch(module)
            except Exception as e:  # a library we do not know: it keeps working without comms
                print("magpy-kernel: could not adapt %s for comms (%s: %s)"
                      % (name, type(e).__name__, _safe_str(e)), file=_log)

        spec.loader.exec_module = exec_module  # the loader is this spec's own instance
        return spec


def install_comms(shell):
    """Comms need the `comm` package (Debian's python3-comm); without it the kernel runs as
    before and widgets show no live state."""
    import importlib.util
    try:
        available = importlib.util.find_spec("comm") is not None
    except Exception:
        available = False
    if not available:
        return False
    shell.kernel = KernelHandle(shell)
    # The comm package logs failing comm callbacks and unknown targets; like ipykernel's, those
    # lines go to the kernel's terminal, not into whatever cell's stderr comes next.
    import logging
    comm_log = logging.getLogger("Comm")
    handler = logging.StreamHandler(_log)
    handler.setFormatter(logging.Formatter("[magpy-kernel comm] %(levelname)s | %(message)s"))
    comm_log.addHandler(handler)
    comm_log.propagate = False
    patches = {"comm": _patch_comm_package, "ipykernel.comm": _patch_ipykernel_comm}
    for name in list(patches):
        if name in sys.modules:
            patches.pop(name)(sys.modules[name])
    sys.meta_path.insert(0, _AfterImport(patches))
    return True


class _KernelLog(io.TextIOBase):
    """The kernel's own log: the terminal Jupyter started it from, never a notebook. Looked
    up on each write, because the kernel moves it off fd 2 only after start-up."""

    def writable(self):
        return True

    def write(self, text):
        data = str(text).encode("utf-8", "replace")
        try:
            os.write(_k.log_fd(), data)
        except OSError:
            pass
        return len(text)


_log = _KernelLog()


# --- the shell ---------------------------------------------------------------------------------

def _make_classes():
    """Defined lazily so that importing this module does not import IPython."""
    from IPython.core.autocall import ExitAutocall
    from IPython.core.displayhook import DisplayHook
    from IPython.core.displaypub import DisplayPublisher
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.core import page, payloadpage
    from traitlets import Type, default

    class KernelDisplayPublisher(DisplayPublisher):
        """display(), update_display(), clear_output() → IOPub messages, sent from C++.

        Safe to call from any thread (IOPub sends under its own lock, stamped with the
        request being run), so %%magpy's live view may tick from its own thread."""

        magpy_live = "threaded"

        def publish(self, data, metadata=None, source=None, *, transient=None, update=False,
                    **kwargs):
            _k.publish_display(data, metadata or {}, transient or {}, bool(update))

        def clear_output(self, wait=False):
            _k.publish_clear_output(bool(wait))

    class KernelDisplayHook(DisplayHook):
        """The value of a cell's last expression → one execute_result (Out[n])."""

        def start_displayhook(self):
            self._bundle = None

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            self._bundle = (format_dict, md_dict or {})

        def finish_displayhook(self):
            if self._bundle and self._bundle[0]:
                _k.publish_execute_result(int(self.prompt_count), self._bundle[0],
                                          self._bundle[1])
            self._bundle = None

    class KernelExitAutocall(ExitAutocall):
        """exit() and quit(): the kernel ends after the cell's reply (the frontend restarts
        it), unless exit(keep_kernel=True), as in ipykernel."""

        def __call__(self, keep_kernel=False):
            self._ip.keepkernel_on_exit = bool(keep_kernel)
            self._ip.ask_exit()

    class KernelShell(InteractiveShell):
        # (named as ipykernel's shell: libraries tell a notebook from a terminal by
        # `get_ipython().__class__.__name__ == "ZMQInteractiveShell"`, rich among them)
        display_pub_class = Type(KernelDisplayPublisher)
        displayhook_class = Type(KernelDisplayHook)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.last_traceback = None
            # `obj?` and %pinfo page through the execute_reply payload, as ipykernel does.
            self.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)

        def enable_gui(self, gui=None):
            # %matplotlib inline asks for no event loop; others cannot run in this kernel, and
            # their windows would not respond: say so (a review probe found it silent).
            if gui not in (None, "inline"):
                import warnings
                warnings.warn("the magpy kernel runs no %r event loop: its windows will not "
                              "respond; use %%matplotlib inline" % gui, stacklevel=2)

        def _showtraceback(self, etype, evalue, stb):
            # The error goes out as one IOPub `error` message (not as stderr text), and the
            # reply reuses the same traceback.
            self.last_traceback = list(stb)
            _k.publish_error(etype.__name__, _safe_str(evalue), self.last_traceback)

        keepkernel_on_exit = False

        @default("exiter")
        def _exiter_default(self):
            return KernelExitAutocall(self)

        def init_environment(self):
            # as ipykernel: `!git log`, `!man` would start a pager that waits for a key no
            # one can press
            os.environ.update(TERM="xterm-color", CLICOLOR="1", PAGER="cat", GIT_PAGER="cat")

        def ask_exit(self):
            self.exit_now = not self.keepkernel_on_exit
            self.payload_manager.write_payload(
                {"source": "ask_exit", "keepkernel": self.keepkernel_on_exit})

        def set_next_input(self, text, replace=False):
            self.payload_manager.write_payload(
                {"source": "set_next_input", "text": text, "replace": bool(replace)})

    KernelShell.__name__ = KernelShell.__qualname__ = "ZMQInteractiveShell"
    return KernelShell


def _make_shell():
    """The shell through IPython's application machinery when possible (profile config,
    startup files, exec_lines, as ipykernel), plainly otherwise."""
    KernelShell = _make_classes()
    try:
        from IPython.core.application import BaseIPythonApplication
        from IPython.core.shellapp import InteractiveShellApp

        class KernelApp(BaseIPythonApplication, InteractiveShellApp):
            name = "ipython-kernel"

            def init_crash_handler(self):
                pass  # a crash report dialog has no place in a kernel

            def init_path(self):
                _working_directory_first()

            def init_shell(self):
                self.shell = KernelShell.instance(parent=self, profile_dir=self.profile_dir,
                                                  ipython_dir=self.ipython_dir)

            def initialize(self, argv=None):
                super().initialize(argv=[])
                self.init_path()
                self.init_shell()
                self.init_extensions()
                self.init_code()

        app = KernelApp.instance()
        app.initialize()
        # Its log (ipywidgets' warnings, IPython's) goes to the kernel's terminal, as
        # ipykernel's does: fd 2 will lead into the notebook.
        import logging
        for handler in app.log.handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(_log)
        return app.shell
    except Exception as e:  # a broken profile must not keep the kernel from starting
        print("magpy-kernel: IPython profile set-up failed (%s: %s); using defaults"
              % (type(e).__name__, e), file=sys.__stderr__)
        _working_directory_first()
        return KernelShell.instance()


def _working_directory_first():
    # as in ipykernel (IPython's terminal puts it after the standard library: a notebook's own
    # `test.py` would lose)
    if sys.path[:1] != [""]:
        sys.path.insert(0, "")


connection_file = None  # set by main.cpp: the path Jupyter gave the kernel


def _register_kernel_magics(shell):
    """The magics ipykernel's shell adds to IPython's or replaces: %clear, %autosave,
    %connect_info, %qtconsole, %less and %more, %edit (review probes found them missing or
    failing)."""
    from IPython.core import page
    from IPython.core.error import UsageError

    def clear(line=""):
        """Clear the terminal (as ipykernel's: the escape sequence a terminal clears on)."""
        print("\x1b[H\x1b[2J", end="")

    def autosave(line=""):
        """%autosave N: save the notebook every N seconds (0: never). The classic notebook
        runs the JavaScript this displays."""
        try:
            seconds = int(line.strip())
        except ValueError:
            raise UsageError("%%autosave needs a whole number of seconds, not %r" % line.strip())
        if seconds < 0:
            raise UsageError("%%autosave needs 0 or more seconds, not %d" % seconds)
        from IPython.display import Javascript, display
        display(Javascript("IPython.notebook.set_autosave_interval(%d)" % (seconds * 1000)))
        print("Autosaving every %d seconds" % seconds if seconds else "Autosave disabled")

    def connect_info(line=""):
        """Print what another client needs to connect to this kernel."""
        if not connection_file:
            raise UsageError("this kernel was not told its connection file")
        try:
            with open(connection_file) as f:
                info = f.read()
        except OSError as e:
            raise UsageError("cannot read the connection file %s: %s" % (connection_file, e))
        name = os.path.basename(connection_file)
        print(info.rstrip())
        print("\nTo connect another client to this kernel, run\n"
              "    jupyter console --existing %s\n"
              "(with the file's full path, %s, from another machine's copy of it)."
              % (name, connection_file))

    def qtconsole(line=""):
        """%qtconsole [options]: open a Qt console on this kernel, as ipykernel's does (a
        separate process, given the connection file and the options)."""
        import importlib.util
        import shlex
        import subprocess
        if not connection_file:
            raise UsageError("this kernel was not told its connection file")
        if importlib.util.find_spec("qtconsole") is None:
            raise UsageError("%qtconsole needs the Qt console, which is not installed here: "
                             "run `apt-get install python3-qtconsole`, then %qtconsole again")
        try:
            options = shlex.split(line)
        except ValueError as e:
            raise UsageError("%%qtconsole cannot read its options %r: %s" % (line, e))
        subprocess.Popen(
            [sys.executable, "-c", "from qtconsole import qtconsoleapp; qtconsoleapp.main()",
             "--existing", connection_file] + options,
            stdin=subprocess.DEVNULL, close_fds=True, start_new_session=True)

    def less(line=""):
        """Show a file in the pager."""
        path = os.path.expanduser(line.strip())
        if not path:
            raise UsageError("%less and %more need a file name")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise UsageError("cannot read %s: %s" % (path, e.strerror or e))
        page.page(text)

    def edit(line=""):
        """%edit [-n LINE] [-p] [-r] [-x] TARGET: open a file, a function's source or earlier
        input in the frontend's editor (an `edit_magic` payload, as ipykernel sends: the
        kernel has no terminal to start an editor in)."""
        from IPython.core.magics.code import CodeMagics, MacroToEdit
        opts, args = magics.parse_options(line, "prxn:")
        try:
            filename, lineno, _ = CodeMagics._find_edit_target(shell, args, opts, last_edit)
        except MacroToEdit:
            raise UsageError("%edit of a macro needs a terminal IPython; edit its text instead")
        if filename is None:
            return  # (IPython said why)
        shell.payload_manager.write_payload(
            {"source": "edit_magic", "filename": os.path.abspath(filename),
             "line_number": lineno})

    magics = shell.magics_manager.registry["CodeMagics"]  # (for its option parsing)
    last_edit = ["", ""]  # what `%edit -p` edits again
    for fn, name in ((clear, "clear"), (autosave, "autosave"), (connect_info, "connect_info"),
                     (qtconsole, "qtconsole"), (less, "less"), (less, "more"), (edit, "edit"), (edit, "ed")):
        shell.register_magic_function(fn, magic_kind="line", magic_name=name)


def _load_magpy(shell):
    """%%magpy (and %magpy, %magpy_explain) in every notebook, without importing magpy and
    torch at start-up: stand-ins load the extension on first use (it replaces them) and pass
    the call on. If magpy cannot be found or loaded, %%magpy says why instead of 'magic not
    found'. Returns the reason it is unavailable, or None."""
    import importlib.util
    from IPython.core.error import UsageError

    def unavailable(reason):
        def magpy_unavailable(line="", cell=None):
            raise UsageError(
                "%%magpy is unavailable: the magpy extension failed to load (" + reason + "). "
                "Check that `/usr/bin/python3 -c 'import magpy'` works (scripts/main-job.sh "
                "installs it), then run %load_ext magpy.")
        shell.register_magic_function(magpy_unavailable, magic_kind="line_cell",
                                      magic_name="magpy")

    try:
        found = importlib.util.find_spec("magpy") is not None
    except BaseException as e:  # noqa: B902
        found, reason = False, "%s: %s" % (type(e).__name__, _safe_str(e))
    else:
        reason = "no module named 'magpy'"
    if not found:
        unavailable(reason)
        return reason

    def load():
        try:
            status = shell.extension_manager.load_extension("magpy")
            if status == "no load function":
                raise ImportError("the magpy module has no load_ipython_extension()")
        except BaseException as e:  # noqa: B902 (an extension may raise anything)
            why = "%s: %s" % (type(e).__name__, _safe_str(e))
            unavailable(why)
            raise UsageError("%%magpy is unavailable: the magpy extension failed to load (" +
                             why + ")") from None

    def magpy(line="", cell=None):
        load()
        if cell is None:
            return shell.run_line_magic("magpy", line)
        return shell.run_cell_magic("magpy", line, cell)

    def magpy_explain(line=""):
        load()
        return shell.run_line_magic("magpy_explain", line)

    shell.register_magic_function(magpy, magic_kind="line_cell", magic_name="magpy")
    shell.register_magic_function(magpy_explain, magic_kind="line", magic_name="magpy_explain")
    return None


# Inputs written to the history database per batch (IPython's default is every cell, which
# wakes its saving thread for an sqlite commit on each request: ~0.2 ms of every round trip on
# two cores). A history request, %history and shutdown write the batch out first; a kernel
# killed outright loses at most this many inputs of its own session.
HISTORY_BATCH = 10


def _batch_history_writes(shell):
    hm = getattr(shell, "history_manager", None)
    if hm is None or not hm.enabled:
        return
    try:
        configured = "db_cache_size" in shell.config.get("HistoryManager", {})
    except Exception:
        configured = False
    if not configured:  # a profile that sets it keeps its value
        hm.db_cache_size = HISTORY_BATCH
    # %history -g / -l search the database: give them the batch too
    shell.events.register("pre_run_cell", lambda *a: _writeout_if_history_magic(shell, *a))


def _write_history_and_terminate(signum, frame):
    # A restart while a cell runs (jupyter_client: shutdown_request, which waits for the cell,
    # then SIGTERM): the batched inputs are written before the kernel goes.
    try:
        _shell.history_manager.writeout_cache()
    except Exception:
        pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _interruptible_pdb():
    """pdb.set_trace() and breakpoint() with IPython's debugger that an interrupt leaves (plain
    pdb takes the interrupt and prompts again: the cell would never end), as in ipykernel."""
    try:
        import pdb
        from IPython.core import debugger
    except ImportError:
        return
    quittable = getattr(debugger, "InterruptiblePdb", None)
    if quittable is not None:
        debugger.Pdb = pdb.Pdb = quittable
        pdb.set_trace = debugger.set_trace


def _writeout_if_history_magic(shell, info=None):
    cell = getattr(info, "raw_cell", "") or ""
    if "%hist" in cell or "%rerun" in cell or "%recall" in cell:
        shell.history_manager.writeout_cache()


def start():
    """Creates the shell. Called once by the C++ interpreter's configure step."""
    global _shell
    # Figures show inline without %matplotlib, as in ipykernel.
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    _shell = _make_shell()
    _batch_history_writes(_shell)
    signal.signal(signal.SIGTERM, _write_history_and_terminate)
    # A forked child (multiprocessing's workers) must not write this kernel's history when
    # it is terminated: the kernel's next cell would find its session taken.
    os.register_at_fork(after_in_child=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    _interruptible_pdb()
    try:  # tqdm.auto and others look for this key to know they run in a kernel
        _shell.config.setdefault("IPKernelApp", {})
    except Exception:
        pass
    builtins.input = kernel_input
    getpass.getpass = kernel_getpass
    install_comms(_shell)
    try:  # (a magic that cannot be set up must not keep the kernel from starting)
        _register_kernel_magics(_shell)
    except Exception as e:
        print("magpy-kernel: ipykernel's extra magics unavailable: %s: %s"
              % (type(e).__name__, e), file=sys.__stderr__)
    magpy_error = _load_magpy(_shell)
    if magpy_error:
        print("magpy-kernel: %%magpy unavailable: " + magpy_error, file=sys.__stderr__)
    return magpy_error


def kernel_info():
    import IPython
    return {
        "status": "ok",
        "implementation": "magpy",
        "implementation_version": KERNEL_VERSION,
        "language_info": {
            "name": "python",
            "version": platform.python_version(),
            "mimetype": "text/x-python",
            "file_extension": ".py",
            "pygments_lexer": "ipython3",
            "codemirror_mode": {"name": "ipython", "version": 3},
            "nbconvert_exporter": "python",
        },
        "banner": "magpy kernel %s (xeus, C++) - Python %s - IPython %s\n"
                  "%%%%magpy runs a cell under the magpy graph-capture engine.\n"
                  % (KERNEL_VERSION, platform.python_version(), IPython.__version__),
        "help_links": [
            {"text": "Python", "url": "https://docs.python.org/3/"},
            {"text": "IPython", "url": "https://ipython.readthedocs.io/en/stable/"},
            {"text": "PyTorch", "url": "https://pytorch.org/docs/stable/"},
        ],
        "debugger": False,
    }


# --- requests ----------------------------------------------------------------------------------

def _safe_str(value):
    try:
        return str(value)
    except BaseException:  # noqa: B902 (a broken __str__ must not break the reply)
        return "<unprintable %s object>" % type(value).__name__


# [Note: asyncio between cells]
# ipykernel runs every cell inside its running asyncio loop, and the loop goes on between
# cells: `asyncio.create_task(...)` works in a plain cell, and the task runs while the kernel
# waits (a review probe found neither here). Cells run as a task on IPython's own loop (the
# one its top-level `await` uses), through run_cell_async when the cell awaits, as ipykernel
# does. Between cells the C++ main loop calls run_asyncio before each wait for a request: it
# runs the callbacks that are due, once, and names how long the wait may last (no time when
# more are ready, until the next timer, or until a request) and the loop's selector fd, which
# the kernel's wait watches beside its sockets: a socket, a pipe or call_soon_threadsafe from
# another thread wakes it (a second probe found those waiting for the next cell). An interrupt
# that lands while the loop waits for the cell's task cancels that task, so it never resumes
# later (as ipykernel's cell ends).
_TASK_WAIT_MS = 10  # only where the selector has no fd to watch


def _cell_loop():
    from IPython.core.async_helpers import get_asyncio_loop
    loop = get_asyncio_loop()
    asyncio.set_event_loop(loop)  # asyncio.get_event_loop() in a cell: this one
    return loop


def _selector_fd(loop):
    try:
        return loop._selector.fileno()
    except Exception:
        return -1


def run_asyncio(io_ready=False):
    """Runs what is due in the cells' loop; returns (ms the kernel may wait or -1, an fd that
    ends the wait or -1)."""
    from IPython.core import async_helpers
    loop = async_helpers._asyncio_event_loop
    if loop is None or loop.is_closed() or loop.is_running():
        return -1, -1
    try:
        if io_ready or loop._ready or loop._scheduled:
            loop.call_soon(loop.stop)
            loop.run_forever()
    except BaseException as e:  # a task's SystemExit or KeyboardInterrupt: the others go on
        print("magpy-kernel: an asyncio task raised %s between cells: %s"
              % (type(e).__name__, _safe_str(e)), file=sys.__stderr__)
        return 0, -1
    if loop._ready:
        return 0, -1
    wait = -1
    if loop._scheduled:
        wait = max(0, min(1000, int((loop._scheduled[0].when() - loop.time()) * 1000) + 1))
    fd = _selector_fd(loop)
    if fd < 0 and asyncio.all_tasks(loop):
        wait = _TASK_WAIT_MS if wait < 0 else min(wait, _TASK_WAIT_MS)
    return wait, fd


def _run_cell_in_loop(shell, code, store_history, silent):
    async def execute():
        transformed, exc_tuple = code, None
        try:
            transformed = shell.transform_cell(code)
        except Exception:
            exc_tuple = sys.exc_info()
        if shell.should_run_async(code, transformed_cell=transformed,
                                  preprocessing_exc_tuple=exc_tuple):
            return await shell.run_cell_async(code, store_history=store_history, silent=silent,
                                              transformed_cell=transformed,
                                              preprocessing_exc_tuple=exc_tuple)
        return shell.run_cell(code, store_history=store_history, silent=silent)
    loop = _cell_loop()
    if loop.is_running():  # (a cell run from a cell: IPython's own get_ipython().run_cell)
        return shell.run_cell(code, store_history=store_history, silent=silent)
    task = loop.create_task(execute())
    try:
        return loop.run_until_complete(task)
    except BaseException:
        # an interrupt while the loop waited for the cell: the cell ends here, for good
        if not task.done():
            task.cancel()
            try:
                loop.run_until_complete(task)
            except BaseException:
                pass
        raise


def run_cell(code, store_history, silent, user_expressions, execution_count):
    """One execute_request. Returns the reply content without execution_count."""
    shell = _shell
    shell.execution_count = execution_count
    shell.last_traceback = None
    try:
        result = _run_cell_in_loop(shell, code, store_history, silent)
        error = None if result.success else (result.error_before_exec or result.error_in_exec)
        failed = not result.success
    except BaseException as e:  # noqa: B902 (e.g. an interrupt inside IPython's bookkeeping)
        shell.showtraceback()
        error, failed = e, True
    shell.execution_count = execution_count  # the C++ side owns the counter

    if failed:
        reply = {"status": "error",
                 "ename": type(error).__name__ if error is not None else "Error",
                 "evalue": _safe_str(error) if error is not None else "",
                 "traceback": shell.last_traceback or []}
        reply["user_expressions"] = {}
    else:
        reply = {"status": "ok",
                 "user_expressions": shell.user_expressions(user_expressions or {})}
    reply["payload"] = shell.payload_manager.read_payload()
    shell.payload_manager.clear_payload()
    if shell.exit_now:  # exit() or quit(): the C++ side ends the kernel after this reply
        shell.exit_now = False
        reply["_exit"] = True
    return reply


def complete(code, cursor_pos):
    from IPython.core.completer import provisionalcompleter, rectify_completions
    if cursor_pos is None or cursor_pos < 0 or cursor_pos > len(code):
        cursor_pos = len(code)
    with provisionalcompleter():
        completions = list(rectify_completions(code, _shell.Completer.completions(code,
                                                                                  cursor_pos)))
    if completions:
        start, end = completions[0].start, completions[0].end
    else:
        start = end = cursor_pos
    types = [{"start": c.start, "end": c.end, "text": c.text, "type": c.type,
              "signature": c.signature} for c in completions]
    return {"status": "ok", "matches": [c.text for c in completions], "cursor_start": start,
            "cursor_end": end, "metadata": {"_jupyter_types_experimental": types}}


def inspect(code, cursor_pos, detail_level):
    from IPython.utils.tokenutil import token_at_cursor
    if cursor_pos is None or cursor_pos < 0 or cursor_pos > len(code):
        cursor_pos = len(code)
    name = token_at_cursor(code, cursor_pos)
    try:
        data = _shell.object_inspect_mime(name, detail_level=1 if detail_level else 0)
        found = True
    except KeyError:
        data, found = {}, False
    if not _shell.enable_html_pager:  # as ipykernel: frontends that prefer HTML show the text
        data.pop("text/html", None)
    return {"status": "ok", "found": found, "data": data, "metadata": {}}


def is_complete(code):
    status, indent = _shell.input_transformer_manager.check_complete(code)
    reply = {"status": status}
    if status == "incomplete":
        reply["indent"] = " " * (indent or 0)
    return reply


def history(kind, session, start, stop, n, pattern, raw, output, unique):
    """IPython's own history (the sqlite database ipykernel uses too): sessions and lines are
    integers, and output=True gives [session, line, [input, output]]."""
    hm = _shell.history_manager
    hm.writeout_cache()  # the inputs still batched (HISTORY_BATCH)
    if kind == "tail":
        entries = hm.get_tail(n, raw=raw, output=output, include_latest=True)
    elif kind == "range":
        entries = hm.get_range(session, start, stop, raw=raw, output=output)
    elif kind == "search":
        entries = hm.search(pattern, raw=raw, output=output, n=n, unique=unique)
    else:  # as ipykernel: an empty history for a kind it does not know
        entries = []
    current = hm.session_number  # IPython numbers the current session 0 in ranges
    return [[s or current, line, list(x) if output else x] for s, line, x in entries]


def shutdown():
    """What a normal interpreter exit would do: IPython's clean-up and atexit callbacks."""
    import atexit
    try:
        _shell.atexit_operations()
    finally:
        atexit._run_exitfuncs()
