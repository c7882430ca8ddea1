"""Facts about the interpreter that the compatibility layer (core/src/python/compat.h) depends
on, printed as JSON: version, opcode numbers and inline cache sizes, and which opcodes the test
suite's code compiles to (per file, counted over every nested code object)."""
import dis
import json
import opcode
import os
import sys
import sysconfig

root = sys.argv[1] if len(sys.argv) > 1 else "."
facts = {
    "version": sys.version,
    "hexversion": hex(sys.hexversion),
    "include": sysconfig.get_paths()["include"],
    "opmap": opcode.opmap,
    "cache_entries": {opcode.opname[i]: n
                      for i, n in enumerate(getattr(opcode, "_inline_cache_entries", []))
                      if n},
    "hasjrel": [opcode.opname[i] for i in opcode.hasjrel],
    "hasjabs": [opcode.opname[i] for i in opcode.hasjabs],
    "specializations": getattr(opcode, "_specializations", {}),
    "has_monitoring": hasattr(sys, "monitoring"),
}
counts = {}


def walk(co):
    for ins in dis.get_instructions(co):
        counts[ins.opname] = counts.get(ins.opname, 0) + 1
    for c in co.co_consts:
        if hasattr(c, "co_code"):
            walk(c)


for sub in ("tests/python", "bench", "tests/fuzz", "core/python/magpy"):
    d = os.path.join(root, sub)
    for dirpath, _, files in os.walk(d):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                try:
                    walk(compile(open(path).read(), path, "exec"))
                except SyntaxError as e:
                    print("syntax error", path, e, file=sys.stderr)
facts["opcode_use"] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
json.dump(facts, sys.stdout, indent=1)
