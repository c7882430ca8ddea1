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
the contents of each cell variable that is not an argument (None when empty), then the
defaults of the inner functions the prologue makes again (`functions`). Offsets are in
code units. This module is the bytecode half of the compatibility layer (core/src/python/
compat.h is the other): CPython 3.11 and 3.12, whose bytecode, line table and exception table
formats are alike; 3.12 has no PRECALL (CALL alone), LOAD_ATTR's low bit is LOAD_METHOD, and
a class body reads a cell with LOAD_FROM_DICT_OR_DEREF instead of LOAD_CLASSDEREF.
"""

import dis
import functools
import sys
import types
import weakref

__all__ = ["make_resume", "ResumeUnsupported"]

_OP = dis.opmap
_CACHES = dis._inline_cache_entries
# Instructions whose argument is an index into the fast locals past co_varnames (cells, frees).
_DEREF_OPS = {_OP[n] for n in ("MAKE_CELL", "LOAD_CLOSURE", "LOAD_DEREF", "STORE_DEREF",
                               "DELETE_DEREF", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF")
              if n in _OP}
_PY312 = sys.version_info[:2] == (3, 12)
_NOT_PLAIN = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async gen
_VARARGS, _VARKEYWORDS = 0x04, 0x08

STACK_PREFIX = "$stack"
CELL_PREFIX = "$cell"
FUNCTION_PREFIX = "$fn"


class ResumeUnsupported(Exception):
    """The frame cannot be continued by a resume function (the message says why)."""


def _check_version():
    if sys.version_info[:2] not in ((3, 11), (3, 12)):
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
    for start, size, target, depth_lasti in _exception_ranges(table):
        _write_varint(out, start + units, True)
        _write_varint(out, size, False)
        _write_varint(out, target + units, False)
        _write_varint(out, depth_lasti, False)
    return bytes(out)


def _exception_ranges(table):
    """(start, size, target, depth_lasti) of each entry of a 3.11 exception table (code units)."""
    i = 0
    while i < len(table):
        start, i = _read_varint(table, i)
        size, i = _read_varint(table, i)
        target, i = _read_varint(table, i)
        depth_lasti, i = _read_varint(table, i)
        yield start, size, target, depth_lasti


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


def make_resume(code, target, stack_nulls, unbound, hide_args=False, launcher=None,
                functions=()):
    """Returns (resume code, shift in code units) continuing `code` at `target`.

    stack_nulls: one bool per value-stack entry at `target`, bottom first (True: the entry is
    the NULL CPython pushes before some callables). unbound: indices into co_varnames and
    co_cellvars (fast-local indices) that hold no value at `target`. hide_args: the prologue
    unbinds the extra arguments that carried the stack and the cells once it has used them,
    so the frame's locals are the original's (`locals()`, `dir()` and `vars()` run in it).
    launcher: with hide_args, make a bridge when the statement at `target` allows it (see
    make_bridge); the whole rest of the function otherwise.
    functions: inner functions the prologue makes again over the new frame's own cells
    ([Note: inner functions at a break] in core/src/replay/resume.h), each
    (code, annotations, has_defaults, has_kwdefaults, targets): annotations a tuple of names
    and values or None; targets (kind, index) pairs, kind "var" (a co_varnames index), "stack"
    (a non-NULL stack entry, bottom first) or "cell" (a cell that is not an argument, in
    order). Their defaults and keyword defaults are further arguments after the cells.
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
    nparts = sum(bool(d) + bool(kw) for _, _, d, kw, _ in functions)
    new_varnames = (varnames + tuple(f"{STACK_PREFIX}{k}" for k in range(nstack_args)) +
                    tuple(f"{CELL_PREFIX}{k}" for k in range(len(pure_cells))) +
                    tuple(f"{FUNCTION_PREFIX}{k}" for k in range(nparts)))
    extra = nstack_args + len(pure_cells) + nparts
    # Fast-local index of every cell in the new code: arguments keep theirs, the rest move.
    cell_index = {}
    for k, c in enumerate(pure_cells):
        cell_index[c] = len(new_varnames) + k
    for c in cellvars:
        if c in varnames:
            cell_index[c] = varnames.index(c)
    # Old fast-local index of each pure cell (for `unbound`).
    old_pure_index = {c: nvar + k for k, c in enumerate(pure_cells)}
    first_free = len(new_varnames) + len(pure_cells)
    consts = list(code.co_consts)

    def const_index(value):
        for i, c in enumerate(consts):
            if c is value:
                return i
        consts.append(value)
        return len(consts) - 1

    def remake_functions(out):
        # [Note: inner functions at a break]: MAKE_FUNCTION over this frame's new cells
        part = nvar + nstack_args + len(pure_cells)
        for fcode, annotations, has_defaults, has_kwdefaults, targets in functions:
            flags = 0
            for present, bit in ((has_defaults, 0x01), (has_kwdefaults, 0x02)):
                if present:
                    _emit(out, _OP["LOAD_FAST"], part)
                    part += 1
                    flags |= bit
            if annotations:
                _emit(out, _OP["LOAD_CONST"], const_index(annotations))
                flags |= 0x04
            if fcode.co_freevars:
                for name in fcode.co_freevars:
                    if name in cell_index:
                        _emit(out, _OP["LOAD_CLOSURE"], cell_index[name])
                    elif name in code.co_freevars:
                        _emit(out, _OP["LOAD_CLOSURE"], first_free + code.co_freevars.index(name))
                    else:
                        raise ResumeUnsupported(f"{fcode.co_name} closes over {name!r}, "
                                                "which this function does not hold")
                _emit(out, _OP["BUILD_TUPLE"], len(fcode.co_freevars))
                flags |= 0x08
            _emit(out, _OP["LOAD_CONST"], const_index(fcode))
            _emit(out, _OP["MAKE_FUNCTION"], flags)
            for kind, index in targets:
                _emit(out, _OP["COPY"], 1)
                if kind == "var" and varnames[index] in cell_index:
                    _emit(out, _OP["STORE_DEREF"], cell_index[varnames[index]])
                elif kind == "var":
                    _emit(out, _OP["STORE_FAST"], index)
                elif kind == "stack":
                    _emit(out, _OP["STORE_FAST"], nvar + index)
                else:  # a pure cell's argument, stored into the cell below
                    _emit(out, _OP["STORE_FAST"], nvar + nstack_args + index)
            _emit(out, _OP["POP_TOP"])

    def prologue(jump_arg=None):
        out = bytearray()
        if code.co_freevars:
            _emit(out, _OP["COPY_FREE_VARS"], len(code.co_freevars))
        for i in sorted(unbound):
            if i < nvar:
                _emit(out, _OP["DELETE_FAST"], i)
        for c in cellvars:
            _emit(out, _OP["MAKE_CELL"], cell_index[c])
        _emit(out, _OP["RESUME"], 0)
        remake_functions(out)
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
        if jump_arg is not None:
            _emit(out, _OP["JUMP_FORWARD"], jump_arg)
        return bytes(out)

    body = code.co_code
    if extra and (cellvars or code.co_freevars):
        body = _renumber_derefs(body, nvar, extra)
    flags = code.co_flags & ~(_VARARGS | _VARKEYWORDS)
    if hide_args and launcher is not None and not functions:
        try:
            return _bridge(code, target, stack_nulls, prologue(), body, launcher,
                           co_argcount=len(new_varnames), co_posonlyargcount=0,
                           co_kwonlyargcount=0, co_nlocals=len(new_varnames),
                           co_varnames=new_varnames, co_flags=flags)
        except ResumeUnsupported:
            pass  # the whole rest of the function runs as plain Python
    # The jump is the prologue's last instruction, so its distance to `target` (moved by the
    # prologue's length) is `target` itself.
    pro = prologue(target)
    units = len(pro) // 2
    new = code.replace(
        co_code=pro + body,
        co_consts=tuple(consts),
        co_argcount=len(new_varnames),
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_nlocals=len(new_varnames),
        co_varnames=new_varnames,
        co_flags=flags,
        co_stacksize=max(code.co_stacksize, len(stack_nulls) + 1,
                         max((len(f[0].co_freevars) + 5 for f in functions), default=0)),
        co_linetable=_no_location_entries(units) + code.co_linetable,
        co_exceptiontable=_shift_exception_table(code.co_exceptiontable, units),
    )
    return new, units


# [Note: bridges] A call that reads its caller's frame (locals(), logging, warnings.warn; see
# capture/segment.cpp) must run in a real frame that looks like the user's. Its resume code is
# a bridge when its statement is simple: the prologue, a copy of the statement's instructions
# (with their lines, so logging reports the user's line), then a call of the launcher with the
# values left on the stack, whose result the bridge returns. The launcher
# (`launcher(origin, end, stack)`, from the engine) reads the bridge frame's locals and cells
# and goes on at `end` in an ordinary resume function, so the rest of the function is captured
# again. A statement is simple when it is straight-line code (no jumps, returns or raises)
# outside any exception handler's range, ending on a line start with no NULL left on the stack.

_CALLS = {_OP["CALL"], _OP["CALL_FUNCTION_EX"]}
_NOT_IN_BRIDGE = set(dis.hasjrel) | set(dis.hasjabs) | {
    _OP[n] for n in ("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE", "YIELD_VALUE",
                     "SEND", "GET_AWAITABLE", "BEFORE_WITH", "PUSH_EXC_INFO", "POP_EXCEPT",
                     "CHECK_EXC_MATCH", "LOAD_ASSERTION_ERROR", "SETUP_ANNOTATIONS")
    if n in _OP}


def _pushes_null(ins):
    if ins.opcode == _OP["PUSH_NULL"]:
        return True
    if ins.opcode in (_OP["LOAD_GLOBAL"], _OP.get("LOAD_SUPER_ATTR"), _OP["LOAD_ATTR"]):
        # 3.11 LOAD_GLOBAL, 3.12 LOAD_GLOBAL / LOAD_ATTR / LOAD_SUPER_ATTR: the low bit
        return bool(ins.arg & 1) and (_PY312 or ins.opcode == _OP["LOAD_GLOBAL"])
    return ins.opcode == _OP.get("LOAD_METHOD", -1) and not _PY312


def _statement_end(code, target, depth):
    """The offset (code units) of the first line start after the call at or after `target`
    once the call's result is consumed (the rest of its statement done), and the stack depth
    there; ResumeUnsupported if the statement is not simple. Values left on the stack there
    are ones that were below the call's statement, unless the statement consumed them (then
    they count as the NULLs they may have been: see _bridge)."""
    base = None
    done = False  # the call's result has been consumed
    for ins in dis.get_instructions(code):
        off = ins.offset // 2
        if off < target:
            continue
        if done and ins.starts_line is not None:
            return off, depth
        if ins.opcode in _NOT_IN_BRIDGE:
            raise ResumeUnsupported(f"{ins.opname} in the statement of the call")
        if done and _pushes_null(ins):
            raise ResumeUnsupported("a call starts after the statement on its line")
        depth += dis.stack_effect(ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None,
                                  jump=False)
        if off == target and ins.opcode == _OP["CALL"] and not _PY312:
            depth -= ins.arg  # dis counts the arguments off at PRECALL, which ran already
        if base is None and ins.opcode in _CALLS:
            base = depth - 1  # below the call's result
        if base is not None and depth <= base:
            done = True
        if depth < 0:
            raise ResumeUnsupported("the stack runs out")
    raise ResumeUnsupported("no statement after the call")


def _svarint(val):
    """A signed varint of the 3.11 line table (6-bit chunks, least significant first)."""
    val = ((-val) << 1) | 1 if val < 0 else val << 1
    out = bytearray()
    while val >= 64:
        out.append(64 | (val & 63))
        val >>= 6
    out.append(val)
    return bytes(out)


def _line_entries(code, start, end, first_line):
    """Line-table entries (3.11 format, code 13: line only) for the code units [start, end) of
    `code`, starting from line `first_line`; returns (entries, the line they end on)."""
    out = bytearray()
    line = first_line
    for s, e, ln in code.co_lines():
        s, e = max(s // 2, start), min(e // 2, end)
        if s >= e:
            continue
        units = e - s
        if ln is None:
            out += _no_location_entries(units)
            continue
        while units > 0:
            n = min(units, 8)
            out.append(0x80 | (13 << 3) | (n - 1))
            out += _svarint(ln - line)
            line = ln
            units -= n
    return bytes(out), line


# The codes of the bridges made so far: a bridge's frame stands for the function's own frame,
# so what looks at the frames above a compiled function steps over it (magpy/_effects.py).
BRIDGES = weakref.WeakSet()


def _bridge(code, target, stack_nulls, pro, body, launcher, **layout):
    end, depth = _statement_end(code, target, len(stack_nulls))
    for start, size, _, _ in _exception_ranges(code.co_exceptiontable):
        if start < end and target < start + size:
            raise ResumeUnsupported("the statement is inside a try or with block")
    if any(stack_nulls[:depth]):
        raise ResumeUnsupported("a NULL below the statement")
    consts = code.co_consts + (functools.partial(launcher, code, end),)
    tail = bytearray()
    _emit(tail, _OP["BUILD_TUPLE"], depth)
    _emit(tail, _OP["PUSH_NULL"])
    _emit(tail, _OP["SWAP"], 2)
    _emit(tail, _OP["LOAD_CONST"], len(consts) - 1)
    _emit(tail, _OP["SWAP"], 2)
    if not _PY312:
        _emit(tail, _OP["PRECALL"], 1)
    _emit(tail, _OP["CALL"], 1)
    _emit(tail, _OP["RETURN_VALUE"])
    copy = body[2 * target:2 * end]
    units = len(pro) // 2
    lines, _ = _line_entries(code, target, end, code.co_firstlineno)
    new = code.replace(
        co_code=pro + copy + bytes(tail),
        co_consts=consts,
        co_stacksize=max(code.co_stacksize, len(stack_nulls) + 1) + 3,
        co_linetable=_no_location_entries(units) + lines + _no_location_entries(len(tail) // 2),
        co_exceptiontable=b"",
        **layout,
    )
    BRIDGES.add(new)
    return new, units


def make_resume_function(fn_code, globals_, name, qualname, closure, target, stack_nulls,
                         unbound):
    """A function object for a resume code (used by the tests; the engine builds its own)."""
    code, _ = make_resume(fn_code, target, stack_nulls, unbound)
    f = types.FunctionType(code, globals_, name, None, closure)
    f.__qualname__ = qualname
    return f
