"""How this interpreter reports opcode trace events (what Monitor::on_opcode relies on): the
offsets seen for a function whose instructions need EXTENDED_ARG prefixes, and the bytecode
of a comprehension, a generator, a with block and a try block."""
import dis
import sys

src = "def big(z):\n" + "".join(f"    a{i} = z\n" for i in range(300)) + "    return a299 + a0\n"
ns = {}
exec(compile(src, "<big>", "exec"), ns)
big = ns["big"]
seen = []


def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    frame.f_trace_lines = False
    if event == "opcode" and frame.f_code is big.__code__:
        seen.append(frame.f_lasti)
    return tracer


sys.settrace(tracer)
big(1)
sys.settrace(None)
code = big.__code__.co_code
ext = [i for i in range(0, len(code), 2) if code[i] == dis.opmap["EXTENDED_ARG"]]
print("EXTENDED_ARG offsets:", ext[-3:])
print("events near the last one:", [o for o in seen if ext and ext[-1] - 4 <= o <= ext[-1] + 6])


def comp(xs, x=1):
    return [x * 2 for x in xs if x]


def gen(n):
    for i in range(n):
        yield i


def withtry(m, x):
    with m:
        try:
            y = x[1:3]
        except KeyError:
            y = None
    return super(type(m), m).__init__, y


for f in (comp, gen, withtry):
    print("----", f.__name__)
    dis.dis(f)
    print("exception table:", list(dis.Bytecode(f).exception_entries) if hasattr(dis.Bytecode(f), "exception_entries") else "?")
