"""Resume functions: the code that continues a frame after a graph break.

When a capture stops at an instruction it cannot follow, the segment before it replays from
the cache and Python runs the rest of the function. The rest is a new code object made from
the original: a prologue that rebuilds the frame's state (locals, cells, the value stack) from
its arguments, then a jump to the instruction after the break, then the original bytecode,
unchanged. Its name, file and line table are the original's, so tracebacks and line numbers
read as if the function had gone on running; a break in it is captured like any other frame.

    code, shift = make_resume(code, target, stack_nulls, unbound)

The resume function takes, positionally: every name of `co_varnames` (None where `unbound`
says the local has no value), then one argument per non-NULL stack entry (bottom first), then
the contents of each cell variable that is not an argument (None when empty). Offsets are in
code units. This module is the bytecode half of the compatibility layer (core/src/python/
compat.h is the other): CPython 3.11 only for now.
"""

import dis
import sys
import types

__all__ = ["make_resume", "ResumeUnsupported"]

_OP = dis.opmap
_CACHES = dis._inline_cache_entries
# Instructions whose argument is an index into the fast locals past co_varnames (cells, frees).
_DEREF_OPS = {_OP[n] for n in ("MAKE_CELL", "LOAD_CLOSURE", "LOAD_DEREF", "STORE_DEREF",
                               "DELETE_DEREF", "LOAD_CLASSDEREF")}
_NOT_PLAIN = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen
_VARARGS, _VARKEYWORDS = 0x04, 0x08

STACK_PREFIX = "$stack"
CELL_PREFIX = "$cell"


class ResumeUnsupported(Exception):
    """The frame cannot be continued by a resume function (the message says why)."""


def _check_version():
    if sys.version_info[:2] != (3, 11):
        raise ResumeUnsupported(f"resume functions are not built for Python "
                                f"{sys.version_info[0]}.{sys.version_info[1]} yet")


def _emit(out, op, arg=0):
    """Appends one instruction (with EXTENDED_ARG prefixes and its inline caches)."""
    prefixes = []
    a = arg >> 8
    while a:
        prefixes.append(a & 0xFF)
        a >>= 8
    for p in reversed(prefixes):
        out += bytes((_OP["EXTENDED_ARG"], p))
    out += bytes((op, arg & 0xFF))
    out += b"\x00\x00" * _CACHES[op]


def _instr_len(arg):
    n = 1
    arg >>= 8
    while arg:
        n += 1
        arg >>= 8
    return n


def _read_varint(data, i):
    b = data[i]
    val = b & 63
    i += 1
    while b & 64:
        b = data[i]
        i += 1
        val = (val << 6) | (b & 63)
    return val, i


def _write_varint(out, val, start):
    chunks = [val & 63]
    val >>= 6
    while val:
        chunks.append(val & 63)
        val >>= 6
    chunks.reverse()
    for k, c in enumerate(chunks):
        b = c
        if k + 1 < len(chunks):
            b |= 64
        if k == 0 and start:
            b |= 128
        out.append(b)


def _shift_exception_table(table, units):
    """The 3.11 exception table with every start and handler moved `units` code units later."""
    out = bytearray()
    i = 0
    while i < len(table):
        start, i = _read_varint(table, i)
        size, i = _read_varint(table, i)
        target, i = _read_varint(table, i)
        depth_lasti, i = _read_varint(table, i)
        _write_varint(out, start + units, True)
        _write_varint(out, size, False)
        _write_varint(out, target + units, False)
        _write_varint(out, depth_lasti, False)
    return bytes(out)


def _no_location_entries(units):
    """Line-table entries (3.11 format, code 15: no location) covering `units` code units."""
    out = bytearray()
    while units > 0:
        n = min(units, 8)
        out.append(0x80 | (15 << 3) | (n - 1))
        units -= n
    return bytes(out)


def _renumber_derefs(code_bytes, old_limit, delta):
    """Adds `delta` to every cell/free index at or past `old_limit` (new arguments come before
    the cells in the fast locals). The width of each instruction must not change."""
    out = bytearray(code_bytes)
    ext = 0
    ext_start = None
    i = 0
    while i < len(out):
        op, arg = out[i], out[i + 1]
        if op == _OP["EXTENDED_ARG"]:
            if ext_start is None:
                ext_start = i
            ext = (ext | arg) << 8
            i += 2
            continue
        full = ext | arg
        if op in _DEREF_OPS and full >= old_limit:
            new = full + delta
            width = (i - (ext_start if ext_start is not None else i)) // 2 + 1
            if _instr_len(new) > width:
                raise ResumeUnsupported("too many cells to renumber")
            pos = i
            for w in range(width):
                out[pos - 2 * w + 1] = (new >> (8 * w)) & 0xFF
        ext = 0
        ext_start = None
        i += 2 + 2 * _CACHES[op]
    return bytes(out)


def make_resume(code, target, stack_nulls, unbound, hide_args=False):
    """Returns (resume code, shift in code units) continuing `code` at `target`.

    stack_nulls: one bool per value-stack entry at `target`, bottom first (True: the entry is
    the NULL CPython pushes before some callables). unbound: indices into co_varnames and
    co_cellvars (fast-local indices) that hold no value at `target`. hide_args: the prologue
    unbinds the extra arguments that carried the stack and the cells once it has used them,
    so the frame's locals are the original's (`locals()`, `dir()` and `vars()` run in it).
    """
    _check_version()
    if code.co_flags & _NOT_PLAIN:
        raise ResumeUnsupported("generators and coroutines are not continued after a break")
    unbound = set(unbound)
    varnames = code.co_varnames
    nvar = len(varnames)
    cellvars = code.co_cellvars
    pure_cells = [c for c in cellvars if c not in varnames]
    nstack_args = sum(1 for n in stack_nulls if not n)
    new_varnames = (varnames + tuple(f"{STACK_PREFIX}{k}" for k in range(nstack_args)) +
                    tuple(f"{CELL_PREFIX}{k}" for k in range(len(pure_cells))))
    extra = nstack_args + len(pure_cells)
    # Fast-local index of every cell in the new code: arguments keep theirs, the rest move.
    cell_index = {}
    for k, c in enumerate(pure_cells):
        cell_index[c] = len(new_varnames) + k
    for c in cellvars:
        if c in varnames:
            cell_index[c] = varnames.index(c)
    # Old fast-local index of each pure cell (for `unbound`).
    old_pure_index = {c: nvar + k for k, c in enumerate(pure_cells)}

    def prologue(jump_arg):
        out = bytearray()
        if code.co_freevars:
            _emit(out, _OP["COPY_FREE_VARS"], len(code.co_freevars))
        for i in sorted(unbound):
            if i < nvar:
                _emit(out, _OP["DELETE_FAST"], i)
        for c in cellvars:
            _emit(out, _OP["MAKE_CELL"], cell_index[c])
        _emit(out, _OP["RESUME"], 0)
        for k, c in enumerate(pure_cells):
            if old_pure_index[c] in unbound:
                continue
            _emit(out, _OP["LOAD_FAST"], nvar + nstack_args + k)
            _emit(out, _OP["STORE_DEREF"], cell_index[c])
        arg = nvar
        for is_null in stack_nulls:
            if is_null:
                _emit(out, _OP["PUSH_NULL"])
            else:
                _emit(out, _OP["LOAD_FAST"], arg)
                arg += 1
        if hide_args:
            for k in range(extra):
                _emit(out, _OP["DELETE_FAST"], nvar + k)
        _emit(out, _OP["JUMP_FORWARD"], jump_arg)
        return bytes(out)

    # The jump is the prologue's last instruction, so its distance to `target` (moved by the
    # prologue's length) is `target` itself.
    pro = prologue(target)
    units = len(pro) // 2
    body = code.co_code
    if extra and (cellvars or code.co_freevars):
        body = _renumber_derefs(body, nvar, extra)
    flags = code.co_flags & ~(_VARARGS | _VARKEYWORDS)
    new = code.replace(
        co_code=pro + body,
        co_argcount=len(new_varnames),
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_nlocals=len(new_varnames),
        co_varnames=new_varnames,
        co_flags=flags,
        co_stacksize=max(code.co_stacksize, len(stack_nulls) + 1),
        co_linetable=_no_location_entries(units) + code.co_linetable,
        co_exceptiontable=_shift_exception_table(code.co_exceptiontable, units),
    )
    return new, units


def make_resume_function(fn_code, globals_, name, qualname, closure, target, stack_nulls,
                         unbound):
    """A function object for a resume code (used by the tests; the engine builds its own)."""
    code, _ = make_resume(fn_code, target, stack_nulls, unbound)
    f = types.FunctionType(code, globals_, name, None, closure)
    f.__qualname__ = qualname
    return f
