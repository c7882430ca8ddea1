"""Effects that eager Python makes in terms of the frame that calls them, replayed from a plan.

`warnings.warn` reports the file and line of its caller (or of a frame `stacklevel` above it)
and files the warning in that frame's module; a Logger's `info` & co do the same through
`findCaller`. A replay plan runs none of the user's frames, so the capture works out, while
those frames exist, where the call looks (`warn_site`, `log_site`), and the plan calls
`warn` or `log` here with that site:

- a tuple, when the frame found is the compiled function's or one it called: the same at
  every replay (the path to it is guarded);
- an int n, when the walk goes past the compiled function: the frame is then n frames further
  up from the compiled function's caller, looked up at replay, when that caller is running.

The plan calls these functions straight from the compiled function's call, so their own
caller (frame 1) is the compiled function's caller, or a bridge standing for the function's
own frame ([Note: bridges] in _resume.py), which the walk steps over.
"""

import logging
import sys
import types
import warnings

import _warnings

from magpy._resume import BRIDGES

__all__ = ["warn_site", "warn", "log_site", "log", "TracerWarningLog"]


def _importlib_frame(frame):
    name = frame.f_code.co_filename
    return "importlib" in name and "_bootstrap" in name


def _back(f):
    """The frame that called f, bridges stepped over."""
    f = f.f_back
    while f is not None and f.f_code in BRIDGES:
        f = f.f_back
    return f


def _warn_walk(f, steps, skip_internal, stop=None):
    """`steps` frames up from f as CPython's _warnings walks (importlib's own frames skipped
    when `skip_internal`): (filename, lineno, module globals), or the steps still left when
    the walk reaches `stop`."""
    while steps > 0 and f is not None:
        if f is stop:
            return steps
        f = _back(f)
        while skip_internal and f is not None and _importlib_frame(f):
            f = _back(f)
        steps -= 1
    if f is None:
        return ("sys", 1, sys.__dict__)
    return (f.f_code.co_filename, f.f_lineno, f.f_globals)


def warn_site(frame, root, stacklevel):
    """Where `warnings.warn(..., stacklevel=stacklevel)` called in `frame` files its warning:
    (filename, lineno, module globals), or the frames still to walk above `root`."""
    return _warn_walk(frame, stacklevel - 1, not (stacklevel <= 0 or _importlib_frame(frame)),
                      root)


def _above_compiled():
    """The compiled function's caller, seen from a replay step that called _effects: the frame
    between is the step's site frame, which stands for the compiled function's frames
    ([Note: site frames] in replay/plan.cpp)."""
    return _back(sys._getframe(2))


def warn(message, category, site):
    """warnings.warn(message, category) as eager issued it from `site`."""
    if isinstance(site, int):  # the compiled function's caller is one step
        site = _warn_walk(_above_compiled(), site - 1, True)
    filename, lineno, module_globals = site
    registry = module_globals.get("__warningregistry__")
    if registry is None:
        registry = module_globals["__warningregistry__"] = {}
    module = module_globals.get("__name__", "<string>")
    if module is not None and not isinstance(module, str):
        module = "<string>"
    _warnings.warn_explicit(message, category, filename, lineno, module, registry)


def _logging_frame(frame):
    return logging._is_internal_frame(frame)  # logging's own file, or importlib's


def _find_caller(f, left, stop=None):
    """Logger.findCaller's walk from `f`, with `left` frames outside logging still to count:
    (filename, lineno, function name), or the count still left when it reaches `stop`."""
    while True:
        if not _logging_frame(f):
            left -= 1
        up = _back(f)
        if left <= 0 or up is None:
            return (f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
        if f is stop:
            return left
        f = up


def log_site(frame, root, stacklevel):
    """Where a Logger method called in `frame` with `stacklevel` says its record comes from:
    (filename, lineno, function), or the frames outside logging still to find above `root`."""
    return _find_caller(frame, stacklevel, root)


def log(logger, level, msg, args, site, extra):
    """logger.log(level, msg, *args, extra=extra) as eager made it from `site`."""
    if not logger.isEnabledFor(level):
        return
    if not logging._srcfile:
        where = ("(unknown file)", 0, "(unknown function)")
    elif isinstance(site, int):
        where = _find_caller(_above_compiled(), site)
    else:
        where = site
    filename, lineno, function = where
    logger.handle(logger.makeRecord(logger.name, level, filename, lineno, msg, args, None,
                                    function, extra, None))


class WarningRecorder:
    """While active, the warnings of `category` (and its subclasses) are kept in `seen` as
    (category, message, filename, lineno) and shown to no one; every other warning is shown as
    the user's filters and registries decide. The "always" filter for `category` goes first in
    warnings.filters in place: catch_warnings() would reset every module's registry (a warning
    shown once per line would show again)."""

    def __init__(self, category=Warning, raise_errors=False):
        self._category = category
        self._raise_errors = raise_errors

    def __enter__(self):
        self.seen = []
        self._filter = ("always", None, self._category, None, 0)
        warnings.filters.insert(0, self._filter)  # in place: registries stay valid
        self._show = warnings.showwarning
        warnings.showwarning = self._record
        return self

    def _record(self, message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, self._category):
            self._show(message, category, filename, lineno, file, line)
        elif self._raise_errors and self._users_action(message, category, filename,
                                                       lineno) == "error":
            # raised where it is given, as without the recorder: the ops after it do not run
            raise message if isinstance(message, Warning) else category(message)
        else:
            self.seen.append((category, message, filename, lineno))

    def _users_action(self, message, category, filename, lineno):
        """What the filters under the recorder's own would do with this warning (as
        warnings.warn_explicit matches them; the module named after the file)."""
        module = filename[:-3] if filename.endswith(".py") else filename
        text = str(message)
        for f in warnings.filters:
            if f is self._filter:
                continue
            action, msg, cat, mod, ln = f
            if (msg is None or msg.match(text)) and issubclass(category, cat) and \
                    (mod is None or mod.match(module)) and (ln == 0 or lineno == ln):
                return action
        return warnings.defaultaction

    def __exit__(self, *exc):
        if warnings.showwarning == self._record:
            warnings.showwarning = self._show
        for i, f in enumerate(warnings.filters):
            if f is self._filter:
                del warnings.filters[i]
                break
        return False


class TracerWarningLog(WarningRecorder):
    """The TracerWarnings shown while a backend traces a region of a plan (torch warns that the
    trace depends on data), in `seen` as (message, filename, lineno) after the log ends.

    Every other warning is shown as it would be without the trace. TracerWarnings are also
    dropped from the registries of loaded modules (where torch's code runs while tracing): one
    that a filter already handled at a line would otherwise not be seen again.

    `python_warnings`: the other warnings that Python code (torch.nn.functional's, say) gave
    through warnings.warn while tracing, shown or not: a graph of the trace would not give them
    again (a review probe: F.softmax without dim warned on the first call only)."""

    def __init__(self):
        from torch.jit import TracerWarning

        super().__init__(TracerWarning)

    def _warn(self, message, category=None, stacklevel=1, source=None):
        cat = category or (type(message) if isinstance(message, Warning) else UserWarning)
        if not issubclass(cat, self._category):
            self.python_warnings.append(str(message))
        return self._original_warn(message, category, stacklevel + 1, source)

    def __enter__(self):
        self.python_warnings = []
        self._original_warn = warnings.warn
        warnings.warn = self._warn
        for mod in list(sys.modules.values()):
            registry = vars(mod).get("__warningregistry__") if isinstance(
                mod, types.ModuleType) else None
            if isinstance(registry, dict):
                for key in [k for k in registry if isinstance(k, tuple) and len(k) == 3 and
                            isinstance(k[1], type) and issubclass(k[1], self._category)]:
                    del registry[key]
        return super().__enter__()

    def __exit__(self, *exc):
        if warnings.warn == self._warn:
            warnings.warn = self._original_warn
        super().__exit__(*exc)
        self.seen = [(str(m), f, n) for _, m, f, n in self.seen]
        return False
