"""The fx backends ([Note: fx backends] in core/NOTES.md).

Each region of a replay plan (a stretch of pure tensor ops, backends/regions.h) is handed here
as a list of steps and becomes a ``torch.fx.GraphModule``:

- ``fx`` runs that module's generated Python code (any torch; the tests check the graphs
  against eager with it on the CPU machines),
- ``inductor`` compiles it with inductor's ``compile_fx``, called directly (torch >= 2),
- ``cudagraphs`` is inductor with CUDA graphs on, on a GPU: the graph's launches are recorded
  once per input shape and replayed, with inputs copied into static buffers (the modules'
  parameters and buffers are read where they are). Its outputs live in memory the next replay
  reuses, so they are cloned.

A region that cannot be built, compiled or run falls back to its recorded steps (C++ side,
backends/fx_backend.cpp), with a note in explain().
"""

import collections
import copy
import operator
import re
import sys

import torch

import _magpy

from . import _effects

# Step kinds, in the order of kStepKinds in backends/fx_backend.cpp.
_KINDS = ("call", "binary", "compare", "unary", "getitem", "getattr", "list", "tuple", "dict",
          "slice", "setattr", "setitem", "callex", "check")

# Binary steps carry CPython's NB_* operator codes; compare steps Py_LT ... Py_GE.
_BINARY = (operator.add, operator.and_, operator.floordiv, operator.lshift, operator.matmul,
           operator.mul, operator.mod, operator.or_, operator.pow, operator.rshift,
           operator.sub, operator.truediv, operator.xor,
           operator.iadd, operator.iand, operator.ifloordiv, operator.ilshift, operator.imatmul,
           operator.imul, operator.imod, operator.ior, operator.ipow, operator.irshift,
           operator.isub, operator.itruediv, operator.ixor)
_COMPARE = (operator.lt, operator.le, operator.eq, operator.ne, operator.gt, operator.ge)
_UNARY = (operator.neg, operator.pos, operator.invert, operator.not_)

BACKENDS = ("fx", "inductor", "cudagraphs")


def _named_as_itself(fn):
    """Whether the code fx generates for a call of `fn` calls `fn`: a torch function is spelled
    by its qualified name (torch.relu), which the generated code looks up when it runs. A
    review probe replaced torch.relu by a wrapper of the original: the capture called the
    original, and the code called the wrapper."""
    if not callable(fn) or isinstance(fn, torch.nn.Module):
        return True
    try:
        name = torch.fx.node._get_qualified_name(fn)
    except Exception:
        return True  # not spelled by name
    # the owner by its dotted path: a module, or a class in one (torch._C._TensorBase)
    package, *path = name.split(".")
    owner = sys.modules.get(package)
    for part in path[:-1]:
        owner = getattr(owner, part, None)
    return owner is None or not path or getattr(owner, path[-1], fn) is fn


class Unsupported(Exception):
    """A step the graph cannot hold; the region runs its recorded steps."""


def unavailable(backend):
    """Why `backend` cannot run here, or None."""
    if backend == "fx":
        return None
    if not hasattr(torch, "compile"):
        return f"{backend} needs torch >= 2 (torch.compile); this is torch {torch.__version__}"
    if backend == "cudagraphs" and not torch.cuda.is_available():
        return "cudagraphs needs a CUDA GPU; none is available"
    return None


def _tensors_only(v):
    """A tensor, or a list or tuple (nested) of tensors only: an input of the graph (a
    placeholder, read through getitem nodes); any other input is a constant of it."""
    if isinstance(v, torch.Tensor):
        return True
    return type(v) in (list, tuple) and len(v) > 0 and all(_tensors_only(t) for t in v)


def _is_tensor_method(fn):
    name = getattr(fn, "__name__", None)
    return name is not None and getattr(torch.Tensor, name, None) is fn


def _leaves(v):
    """The tensors of a tensor or a (nested) list or tuple of tensors, in order."""
    return [v] if isinstance(v, torch.Tensor) else [t for x in v for t in _leaves(x)]


# Constants fx writes into the generated code as they print.
_LITERALS = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), torch.dtype,
             torch.device, torch.layout, torch.memory_format)


def graph_module(steps, sample, flat=False):
    """The GraphModule computing a region, and the positions of its inputs that are tensors
    or lists and tuples of tensors (its arguments): `steps` are (kind, op, out, args, kwnames,
    name) tuples, args as (0, input index), (1, slot) or (2, constant); the last step builds
    the tuple of outputs. `sample` are
    the region's inputs on this call: the ones that are not tensors (modules, functions,
    numbers) are constants of the graph, which the caller keys it by. With `flat`, each tensor
    of an input list is a placeholder of its own (the caller passes _leaves of the arguments)."""
    g = torch.fx.Graph()
    root = torch.nn.Module()

    def placeholder(v, name):
        if not flat or isinstance(v, torch.Tensor):
            return g.placeholder(name)
        return type(v)(placeholder(t, f"{name}_{k}") for k, t in enumerate(v))

    placeholders = {i: placeholder(v, f"in{i}") for i, v in enumerate(sample)
                    if _tensors_only(v)}
    # Tensor subclasses among the inputs (their ops give subclass results): a method call is
    # written as `t.name(...)`, which runs a subclass's override of it where the program
    # called torch.Tensor's own (an override that calls the base method explicitly)
    subclasses = {type(t) for v in sample if _tensors_only(v) for t in _leaves(v)} - \
        {torch.Tensor, torch.nn.Parameter}
    env = {}
    modules = {}

    def module_name(m):
        name = modules.get(id(m))
        if name is None:
            name = modules[id(m)] = f"m{len(modules)}"
            root.add_module(name, m)
        return name

    def constant_tensor(t):  # an attribute of the module (the same tensor, not a copy)
        name = f"c{len(root._buffers) + len(root._parameters)}"
        if isinstance(t, torch.nn.Parameter):
            root.register_parameter(name, t)
        else:
            root.register_buffer(name, t)
        return g.get_attr(name)

    def constant(v):
        if type(v) in (list, tuple):
            return type(v)(constant(t) for t in v)
        if type(v) is dict:  # (**kwargs holding tensors: each an attribute, not a literal)
            return {k: constant(t) for k, t in v.items()}
        if type(v) is slice:
            return slice(constant(v.start), constant(v.stop), constant(v.step))
        if isinstance(v, torch.Tensor):
            return constant_tensor(v)
        if isinstance(v, torch.nn.Module):
            return g.get_attr(module_name(v))
        if isinstance(v, torch.Size) or type(v) in _LITERALS or callable(v):
            return v  # (fx writes these into the generated code; callables by their names)
        # (torch.return_types.max, a numpy array: fx would write their reprs as code)
        raise Unsupported(f"a constant {type(v).__name__} in the graph")

    def value(arg):
        where, v = arg
        if where == 1:
            return env[v]
        if where == 0:
            if v in placeholders:
                return placeholders[v]
            v = sample[v]
        return constant(v)

    def callee(arg):  # a module called is called as one (call_module), not read
        where, v = arg
        if where == 1 or (where == 0 and v in placeholders):
            return value(arg)
        return sample[v] if where == 0 else v

    def call(fn, args, kwargs):
        if isinstance(fn, torch.fx.Node):
            raise Unsupported("a call of a computed callable")
        if not _named_as_itself(fn):
            raise Unsupported(f"{getattr(fn, '__name__', fn)} is no longer what its name in "
                              f"torch means (the generated code would call that instead)")
        if isinstance(fn, torch.nn.Module):
            return g.call_module(module_name(fn), tuple(args), kwargs)
        if _is_tensor_method(fn) and args:
            if any(getattr(c, fn.__name__, None) is not fn for c in subclasses):
                raise Unsupported(f"a Tensor subclass overrides {fn.__name__} (the generated "
                                  f"code would call the override)")
            return g.call_method(fn.__name__, tuple(args), kwargs)
        return g.call_function(fn, tuple(args), kwargs)

    out = None
    node_steps = {}  # node name -> the step that made it (where its warnings are given)
    for index, (kind, op, slot, args, kwnames, name) in enumerate(steps):
        kind = _KINDS[kind]
        if kind == "call":
            fn = callee(args[0])
            rest = [value(a) for a in args[1:]]
            k = len(kwnames) if kwnames else 0
            positional = rest[:len(rest) - k]
            node = call(fn, positional, dict(zip(kwnames or (), rest[len(rest) - k:])))
        elif kind == "callex":
            fn = callee(args[0])
            positional, kw = value(args[1]), value(args[2]) if len(args) > 2 else None
            if isinstance(positional, torch.fx.Node) or isinstance(kw, torch.fx.Node):
                raise Unsupported("a call with computed *args or **kwargs")
            node = call(fn, list(positional), dict(kw or {}))
        else:
            a = [value(x) for x in args]
            if kind == "binary":
                node = g.call_function(_BINARY[op], tuple(a))
            elif kind == "compare":
                node = g.call_function(_COMPARE[op], tuple(a))
            elif kind == "unary":
                node = g.call_function(_UNARY[op], tuple(a))
            elif kind == "getitem":
                if isinstance(a[0], (list, tuple)):
                    if isinstance(a[1], torch.fx.Node):
                        raise Unsupported("a list indexed with a computed index")
                    node = a[0][a[1]]  # an item of a list built in the region (or flat input)
                else:
                    node = g.call_function(operator.getitem, tuple(a))
            elif kind == "getattr":
                node = g.call_function(getattr, (a[0], name))
            elif kind == "list":
                node = list(a)
            elif kind == "tuple":
                node = tuple(a)
            elif kind == "slice":
                node = slice(*a)
            else:
                raise Unsupported(f"a {kind} step")
        env[slot] = out = node
        if isinstance(node, torch.fx.Node):
            node_steps.setdefault(node.name, index)
    if not isinstance(out, tuple):
        raise Unsupported("a region without its outputs' tuple")
    g.output(out)
    gm = torch.fx.GraphModule(root, g, class_name="magpy_region")
    # the generated code's lines, by the step whose node each one assigns
    gm._magpy_line_steps = {
        n: node_steps[m.group(1)] for n, line in enumerate(gm.code.splitlines(), 1)
        if (m := re.match(r"\s+(\w+) = ", line)) and m.group(1) in node_steps}
    return gm, sorted(placeholders)


_MAX_SHAPES = 8  # compiled versions of one region (input shapes, strides, grad mode), then eager


# What a compiled version is specialised on, read in C++ (backends/fx_backend.cpp): grad mode,
# then per tensor dtype, device, layout, requires_grad, sizes, strides, offset and which earlier
# tensor shares its memory; for pins ((dict, key, tensor) of the modules' parameters and
# buffers), None once a dict holds another tensor under its key. _pins_key(pins, key) says
# whether the pins still have that signature, comparing as it reads (the per-call check).
_key = _magpy._fx_signature
_pins_key = _magpy._fx_pins_signature


def call_recording_warnings(fn, args):
    """fn(*args) and the warnings it gave, as (category, message, step) triples (the step
    whose node gave it, or -1), shown to no one ([Note: warnings from an fx graph] in
    fx_backend.cpp); one that the user's filters make an error is raised where it is given.
    If fn raises, the error goes on with the warnings given before it as `_magpy_warned`."""
    code = getattr(fn, "__code__", None)
    lines = getattr(getattr(fn, "__self__", None), "_magpy_line_steps", {})
    out = error = None
    with _effects.WarningRecorder(raise_errors=True) as rec:
        try:
            out = fn(*args)
        except Exception as e:
            error = e
    warned = [(category, message,
               lines.get(lineno, -1) if code is not None and filename == code.co_filename
               else -1)
              for category, message, filename, lineno in rec.seen]
    if error is not None:
        try:
            error._magpy_warned = warned
        except (AttributeError, TypeError):
            pass
        raise error
    return out, warned


def _memory(t):
    """The address of a tensor's storage (torch 1.13 has no untyped_storage())."""
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def _shares_memory(outs, args):
    """Whether an output is (a view of) an input or of another output (torch >= 2)."""
    seen = {_memory(t) for t in args if isinstance(t, torch.Tensor)}
    for o in outs:
        if isinstance(o, torch.Tensor) and o.numel():
            p = _memory(o)
            if p in seen:
                return True
            seen.add(p)
    return False


def _inductor(backend):
    """compile(gm, example_inputs) -> (callable, whether its outputs must be cloned) for
    `backend`: inductor's compile_fx, called directly. For `cudagraphs`, with CUDA graphs on
    when the inputs are on the GPU and no output shares memory with an input or another output
    (it would share it with a static buffer instead, and a clone would break the aliasing eager
    has): the graph is run once eagerly to see."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    # inductor draws random numbers its own way unless told to call eager's ops: dropout in a
    # compiled graph must draw what eager draws
    patches = {"fallback_random": True}

    def compile(gm, inputs):
        if backend == "cudagraphs" and inputs and all(t.is_cuda for t in inputs) and \
                not _shares_memory(gm(*inputs), inputs):
            # No inductor caches: their keys leave out which inputs are static, so a graph
            # compiled marked could come back for the unmarked fallback (or across processes)
            graphs = dict(patches, **{"triton.cudagraphs": True, "triton.cudagraph_trees": False,
                                      "fx_graph_cache": False})
            return compile_with_static_parameters(gm, inputs, compile_fx, compile_fx_inner,
                                                  graphs), True
        return compile_fx(gm, inputs, config_patches=patches), False
    return compile


def _lifted(gm, inputs):
    """The modules' parameters and buffers in the order inductor's compile_fx lifts them into
    the inputs of the graph it compiles (first, before `inputs`), or None when their positions
    there are not certain: one tensor held twice (tied weights are passed once), or an input
    sharing memory with one."""
    def modules(m):  # in the order of named_modules(remove_duplicate=False)
        yield m
        for child in m._modules.values():
            if child is not None:
                yield from modules(child)

    held = [t for m in modules(gm) for t in m._parameters.values() if t is not None] + \
           [t for m in modules(gm) for t in m._buffers.values() if t is not None]
    if not held or len({id(t) for t in held}) != len(held):
        return None
    memory = {_memory(t) for t in held}
    if any(_memory(t) in memory for t in inputs):
        return None
    return held


def _still_reads_its_inputs(compiled, gm, inputs):
    """Whether `compiled` (a CUDA graph) computes what gm does for inputs it was not recorded
    with: inputs it took for static would keep their first values."""
    compiled(*inputs)  # recorded
    probe = [t + 1 if t.is_floating_point() or t.is_complex() else t for t in inputs]
    outs = []
    for fn in (gm, compiled):
        with torch.random.fork_rng(devices=[t.device for t in inputs if t.is_cuda][:1]):
            torch.manual_seed(0)
            out = fn(*probe)
            out = [out] if isinstance(out, torch.Tensor) else out
            outs.append([o for o in out if isinstance(o, torch.Tensor)])
    return len(outs[0]) == len(outs[1]) and all(
        a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2,
                                              equal_nan=True)
        for a, b in zip(*outs))


# How compile_with_static_parameters compiled each graph: "marked", or why not (read by the
# GPU tests and printed by the backends bench)
static_parameters = collections.Counter()


def compile_with_static_parameters(gm, inputs, compile_fx, compile_fx_inner, patches):
    """compile_fx(gm, inputs) with the modules' parameters and buffers marked as static inputs
    of the CUDA graph. Called directly (not through dynamo), compile_fx lifts them into graph
    inputs without marking them static, and inductor's tree-less cudagraphify then copies every
    one into its static buffers on each call: one launch per tensor (122 for ResNet-18, which
    ran no faster than without CUDA graphs on the device machine). They stay the same objects
    at the same addresses while a compiled version lives (the pins key in compiled_per_key
    holds each one's storage address), and in-place updates land in the memory the graph reads.
    The marking is checked once, on inputs the graph was not recorded with; if it does not
    hold, or compile_fx takes no such marking, the graph is compiled without it."""
    held = _lifted(gm, inputs)
    outcome = "unmarked: no parameters, or their positions are not certain"
    if held is not None:
        marked = []

        def inner(graph, example_inputs, **kwargs):
            # only when the first inputs are exactly the lifted tensors, in order
            if len(example_inputs) == len(held) + len(inputs) and all(
                    tuple(e.shape) == tuple(t.shape) and e.dtype == t.dtype
                    for e, t in zip(example_inputs, held)):
                kwargs["static_input_idxs"] = sorted(
                    set(kwargs.get("static_input_idxs") or ()) | set(range(len(held))))
                marked.append(True)
            return compile_fx_inner(graph, example_inputs, **kwargs)
        try:
            compiled = compile_fx(torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)), inputs,
                                  inner_compile=inner, config_patches=patches)
            if _still_reads_its_inputs(compiled, gm, inputs):
                static_parameters["marked" if marked else
                                  "unmarked: compile_fx's inputs were not the parameters"] += 1
                return compiled
            outcome = "unmarked: the marked graph kept old inputs"
        except Exception as e:
            outcome = f"unmarked: {type(e).__name__}: {str(e)[:120]}"
    static_parameters[outcome] += 1
    return compile_fx(gm, inputs, config_patches=patches)


def compiled_per_key(gm, compile):
    """A callable that compiles `gm` for its inputs once per key (_key) and runs that version.
    For inductor, `compile` is its compile_fx, called directly without torch.compile's frame
    evaluation and guards (magpy's guards and the key stand in for them): 3x less time per call
    than torch.compile(gm) on the device machine (bench/results/gpu-h100-py3.12-torch2.11-fx-
    backends.txt). `cudagraphs` is inductor with CUDA graphs on (their plain, tree-less form):
    each version is recorded once and replayed, inputs copied into static buffers; its outputs
    live in memory the next replay reuses, so they are cloned. The callable takes the region's
    inputs as they come (lists of tensors too) and passes their tensors."""
    versions = {}
    # A compiled version holds the modules' parameters and buffers it was compiled with (the
    # same tensor objects: in-place updates are seen) and is specialised on their metadata. One
    # replaced on its module (`m.weight = nn.Parameter(...)`, a buffer reassigned), or changed
    # in kind (`requires_grad_(False)`, `.half()`), makes the versions stale: compiled again.
    def pinned():
        return [(d, name, t) for m in gm.modules() if m is not gm
                for d in (m._parameters, m._buffers) for name, t in d.items()]

    pins = pinned()
    pins_key = _pins_key(pins)
    swaps = 0

    def run(*args):
        nonlocal pins, pins_key, swaps
        if not _pins_key(pins, pins_key):
            swaps += 1
            if swaps > _MAX_SHAPES:
                raise Unsupported(f"its modules' parameters were replaced or changed more "
                                  f"than {_MAX_SHAPES} times")
            versions.clear()
            pins = pinned()
            pins_key = _pins_key(pins)
        args = _leaves(args)
        key = _key(args)
        fn = versions.get(key)
        if fn is None:
            if len(versions) >= _MAX_SHAPES:
                raise Unsupported(f"more than {_MAX_SHAPES} different input shapes")
            # a graph of its own for each version (compilers rewrite the graph they are
            # given), over the same modules and parameters
            fn = versions[key] = compile(torch.fx.GraphModule(gm, copy.deepcopy(gm.graph)),
                                         args)
        compiled, clone = fn
        out = compiled(*args)
        if clone:
            return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in out)
        return tuple(out)
    return run


def compile_region(steps, sample, backend):
    """(callable, graph text, tensor input positions): the callable takes the region's tensor
    inputs and returns the tuple of its outputs."""
    gm, tensors = graph_module(steps, sample, flat=backend != "fx")
    text = gm.code.strip()
    if backend == "fx":
        # its forward itself: GraphModule.__call__ prints the generated code's traceback to
        # stderr whenever the graph raises (a review probe), where eager prints nothing
        return gm.forward, text, tensors
    why = unavailable(backend)
    if why:
        raise Unsupported(why)
    if backend in ("inductor", "cudagraphs"):
        return compiled_per_key(gm, _inductor(backend)), text, tensors
    raise ValueError(f"unknown fx backend {backend!r}")
