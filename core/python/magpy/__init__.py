"""magpy: capture eager PyTorch programs into operator graphs by monitoring their execution.

    import magpy
    cf = magpy.compile(model)          # or a function
    y = cf(x)                          # same result and side effects as model(x)
    print(magpy.explain(cf))           # graphs, breaks, guards, cache hits

The engine is C++ (the `_magpy` extension); this package is a thin layer over it.
"""

import torch  # noqa: F401  (the engine compares against torch's types)

import _magpy

from ._explain import BREAK_REASONS, Explanation, GraphBreak

__all__ = ["compile", "explain", "reset", "GraphBreakError", "Explanation", "GraphBreak",
           "BREAK_REASONS",
           "backends", "load_ipython_extension"]
__version__ = "0.1.0"

GraphBreakError = _magpy.GraphBreakError
GraphBreakError.__module__ = "magpy"
CompiledFunction = _magpy.CompiledFunction


def compile(fn_or_module, backend="eager", fullgraph=False, dynamic=None, cache_limit=8):
    """Return a callable equivalent to `fn_or_module` that replays captured graphs.

    backend: one of magpy.backends(). fullgraph: raise GraphBreakError at the first construct
    that cannot be captured instead of running it eagerly. dynamic: None (automatic), True or
    False (dynamic shapes arrive in a later version; the value is recorded). cache_limit: how
    many captured variants to keep per function before running new inputs eagerly.
    """
    if not isinstance(backend, str):
        raise TypeError(f"magpy.compile(): backend must be a string such as 'eager', "
                        f"got {backend!r}")
    if dynamic not in (None, True, False):
        raise TypeError(f"magpy.compile(): dynamic must be None, True or False, got {dynamic!r}")
    return _magpy.compile(fn_or_module, backend, bool(fullgraph), dynamic, int(cache_limit))


def explain(compiled):
    """What happened so far in calls of a compiled callable (an Explanation)."""
    return Explanation(_magpy.report_json(compiled))


def reset():
    """Drop every captured graph of every compiled callable."""
    _magpy.reset()


def backends():
    return list(_magpy.backends())


def load_ipython_extension(ipython):
    from ._ipython import load
    load(ipython)
