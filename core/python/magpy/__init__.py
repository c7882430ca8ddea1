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
           "backends", "profile", "profiler_status", "load_ipython_extension"]
__version__ = "0.1.0"

GraphBreakError = _magpy.GraphBreakError
GraphBreakError.__module__ = "magpy"
CompiledFunction = _magpy.CompiledFunction


def compile(fn_or_module, backend="eager", fullgraph=False, dynamic=None, cache_limit=8):
    """Return a callable equivalent to `fn_or_module` that replays captured graphs.

    backend: one of magpy.backends(). fullgraph: raise GraphBreakError at the first construct
    that cannot be captured instead of running it eagerly. dynamic: None (automatic: a tensor
    dim whose size changed between calls becomes symbolic in the next capture), True (every
    dim of the tensors passed in is symbolic from the first call; sizes 0 and 1 stay fixed;
    module attributes and numbers that change become symbolic as in automatic) or
    False (every size is guarded by value). cache_limit: how many captured variants to keep
    per function before running new inputs eagerly.
    """
    if not isinstance(backend, str):
        raise TypeError(f"magpy.compile(): backend must be a string such as 'eager', "
                        f"got {backend!r}")
    if dynamic not in (None, True, False):
        raise TypeError(f"magpy.compile(): dynamic must be None, True or False, got {dynamic!r}")
    return _magpy.compile(fn_or_module, backend, bool(fullgraph), dynamic, int(cache_limit))


def mark_dynamic(tensor, dim):
    """Make dim `dim` (an int or a list of ints) of `tensor` symbolic when a compiled function
    is first called with it: the capture does not specialise on its size."""
    import torch
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"magpy.mark_dynamic(): expected a tensor, got {type(tensor).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool):
            raise TypeError(f"magpy.mark_dynamic(): dim must be an int, got {d!r}")
        if not -tensor.dim() <= d < tensor.dim():
            raise IndexError(f"magpy.mark_dynamic(): dim {d} is out of range for a tensor of "
                             f"rank {tensor.dim()}")
    marked = set(getattr(tensor, "_magpy_dynamic_dims", ()))
    marked.update(d % tensor.dim() for d in dims)
    tensor._magpy_dynamic_dims = tuple(sorted(marked))


def explain(compiled):
    """What happened so far in calls of a compiled callable (an Explanation)."""
    return Explanation(_magpy.report_json(compiled))


def reset():
    """Drop every captured graph of every compiled callable."""
    _magpy.reset()


def backends():
    return list(_magpy.backends())


def profiler_status():
    """The GPU activity profiler (CUPTI): {'available', 'status', 'running', ...}. `status` says
    in one line what it can record here, or why not (no GPU, CUPTI not built)."""
    return dict(_magpy.profiler_status())


class profile:
    """Records GPU kernels, copies and memsets while the block runs, attributed to the compiled
    graphs that launched them; magpy.explain(cf) then lists them per graph. Where nothing can
    be recorded (no GPU), the block runs as it is and `status` says why.

        with magpy.profile() as p:
            cf(x)
        print(p.status, magpy.explain(cf).kernels)
    """

    def __enter__(self):
        self.available = bool(_magpy.profiler_start())
        self.status = _magpy.profiler_status()["status"]
        return self

    def __exit__(self, *exc):
        _magpy.profiler_stop()
        return False


def load_ipython_extension(ipython):
    from ._ipython import load
    load(ipython)
