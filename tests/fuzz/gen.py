"""Random program generator for the magpy differential fuzzer.

`generate(seed)` returns the source text of a self-contained Python module. Executed into a
fresh namespace it defines:

* `fn(...)`: the function under test (tensor ops, Python control flow on guarded values,
  containers, closures, lambdas, comprehensions, user classes, a small nn.Module, global reads
  and writes, side effects on objects passed in);
* `make_args(i) -> (args, kwargs)`: the arguments of call i (fresh tensors, and the program's
  persistent list / dict / object / module passed in);
* `mutate(i)`: changes of external state made between calls (a global int changes, the list
  passed in grows, an attribute changes, a tensor's shape changes, a module flag flips, ...).

The same seed always gives the same text. The generator is type-directed: it tracks the kind of
every variable in scope and the shape of every tensor (dims are ints or symbols such as `B`,
the batch size, which `mutate` changes), so most programs run without errors; some raise on
purpose (and eager and compiled must raise alike). A few constructs that force the engine to
break (`.item()`, branches on tensor data) are mixed in at a low rate.
"""

import os
import random

# MAGPY_FUZZ_BOOST="mappings=8,props=4": multiply the weights of these statement kinds (st_*),
# to aim a long run at one construct. Unset, every seed gives the program it always gave.
BOOST = {k: float(v) for k, v in (item.split("=") for item in
                                  os.environ.get("MAGPY_FUZZ_BOOST", "").split(",") if item)}

# dims: an int, or a symbol (str) whose value may change between calls; tokmin[sym] is its
# smallest possible value.


class V:
    """A variable in scope: its kind and, for tensors and containers of tensors, the shape."""

    def __init__(self, kind, shape=None, fresh=True, min_len=0, ext=False, keys=(), lo=0, hi=4,
                 items=None):
        self.kind = kind        # t int float bool opt tlist tdict obj fn tup
        self.shape = shape      # tensor shape, or the item shape of a tlist/tdict, fn param
        self.fresh = fresh      # tensor made in this call (in-place on it is invisible outside)
        self.min_len = min_len  # tlist: smallest possible length
        self.ext = ext          # tlist/tdict/obj: visible to the caller
        self.keys = set(keys)   # tdict: keys surely present
        self.lo, self.hi = lo, hi  # int: a loose range of values
        self.items = items      # tup: list of (kind, shape)

    def copy(self):
        v = V(self.kind, self.shape, self.fresh, self.min_len, self.ext, self.keys, self.lo,
              self.hi, self.items)
        return v


class E:
    """A generated tensor expression."""

    def __init__(self, code, shape, fresh=True, leaf=False):
        self.code, self.shape, self.fresh, self.leaf = atom(code), tuple(shape), fresh, leaf


def atom(code):
    """`code`, parenthesised if it has an operator outside brackets (so `.m()` binds to all)."""
    depth = 0
    for ch in code:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == " " and depth == 0:
            return f"({code})"
    return code


PARAMS = ("x", "y", "n", "lst", "d", "obj", "m", "idx", "flag", "s", "opt")


def indent(lines, n=1):
    return ["    " * n + l for l in lines]


class ProgramGen:
    def __init__(self, seed, n_calls=6):
        self.seed = seed
        self.r = random.Random(seed)
        self.n_calls = n_calls
        self.nid = 0
        self.tokmin = {"B": 2}
        self.global_writes = set()
        self.features = set()
        self.iterating = []   # containers a loop being generated iterates (never grown inside)
        r = self.r
        self.F = r.choice([3, 4, 5])
        self.H = r.choice([2, 3, 4, 6])
        # how often constructs that force a break appear (most programs should capture)
        self.break_rate = r.choice([0.0, 0.0, 0.02, 0.05, 0.1, 0.2])

    # ------------------------------------------------------------------ small helpers
    def name(self, prefix):
        self.nid += 1
        return f"{prefix}{self.nid}"

    def p(self, prob):
        return self.r.random() < prob

    def choice(self, seq):
        return self.r.choice(list(seq))

    def wchoice(self, pairs):
        """pairs: [(weight, value)] -> value."""
        pairs = [(w, v) for w, v in pairs if w > 0]
        total = sum(w for w, _ in pairs)
        x = self.r.random() * total
        for w, v in pairs:
            x -= w
            if x <= 0:
                return v
        return pairs[-1][1]

    def dmin(self, d):
        return d if isinstance(d, int) else self.tokmin[d]

    def tok(self, mn):
        t = f"T{len(self.tokmin)}"
        self.tokmin[t] = max(0, mn)
        return t

    def dim_add(self, a, b):
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        return self.tok(self.dmin(a) + self.dmin(b))

    def dim_prod(self, dims):
        if all(isinstance(d, int) for d in dims):
            out = 1
            for d in dims:
                out *= d
            return out
        mn = 1
        for d in dims:
            mn *= self.dmin(d)
        return self.tok(mn)

    @staticmethod
    def bcast_into(small, big):
        if len(small) > len(big):
            return False
        for a, b in zip(reversed(small), reversed(big)):
            if not (a == b or a == 1):
                return False
        return True

    def fconst(self):
        return self.choice(["0.5", "2.0", "1.5", "-1.0", "0.25", "3.0", "-0.5"])

    # ------------------------------------------------------------------ scalar expressions
    def ints(self, env):
        return [(n, v) for n, v in env.items() if v.kind == "int"]

    def tensors(self, env, pred=None):
        return [(n, v) for n, v in env.items()
                if v.kind == "t" and (pred is None or pred(v.shape))]

    def gen_int(self, env, depth=1):
        """(code, lo, hi): a Python int expression on guarded values."""
        c = []
        c.append((2, lambda: (str(self.r.randint(0, 3)), 0, 3)))
        for n, v in self.ints(env):
            c.append((4, lambda n=n, v=v: (n, v.lo, v.hi)))
        for n, v in self.tensors(env, lambda s: len(s) >= 1):
            k = self.r.randrange(len(v.shape))
            d = v.shape[k]
            lo = self.dmin(d)
            hi = d if isinstance(d, int) else lo + 6
            c.append((2, lambda n=n, k=k, lo=lo, hi=hi: (
                self.choice([f"{n}.shape[{k}]", f"{n}.size({k})"]), lo, hi)))
            c.append((1, lambda n=n, v=v: (f"{n}.dim()", len(v.shape), len(v.shape))))
        for n, v in env.items():
            if v.kind in ("tlist", "tdict"):
                c.append((2, lambda n=n, v=v: (f"len({n})", v.min_len if v.kind == "tlist"
                                               else len(v.keys), 12)))
            if v.kind == "obj":
                c.append((1, lambda n=n: (f"{n}.count", 0, 12)))
        c.append((1, lambda: ("G_INT", 0, 10)))
        code, lo, hi = self.wchoice(c)()
        if depth > 0 and self.p(0.3):
            code2, lo2, hi2 = self.gen_int(env, depth - 1)
            op = self.choice(["+", "*", "%", "//", "-", "max", "min"])
            if op in ("%", "//"):
                m = self.r.randint(2, 3)
                return (f"({code} {op} {m})", 0, m - 1 if op == "%" else max(0, hi // m))
            if op == "max":
                return (f"max({code}, {code2})", max(lo, lo2), max(hi, hi2))
            if op == "min":
                return (f"min({code}, {code2})", min(lo, lo2), min(hi, hi2))
            if op == "-":
                return (f"({code} - {code2})", lo - hi2, hi - lo2)
            if op == "*":
                return (f"({code} * {code2})", min(lo * lo2, 0), hi * hi2)
            return (f"({code} + {code2})", lo + lo2, hi + hi2)
        return code, lo, hi

    def small_int(self, env, cap=3):
        """An int expression in [0, cap] for range() bounds."""
        code, lo, hi = self.gen_int(env)
        if lo >= 0 and hi <= cap:
            return code
        form = self.r.randrange(3)
        if form == 0:
            return f"min({code}, {cap})" if lo >= 0 else f"min(max({code}, 0), {cap})"
        if form == 1:
            return f"({code} % {cap + 1})"
        return f"max(0, min({code}, {cap}))"

    def gen_float(self, env):
        c = [(2, lambda: self.fconst()), (2, lambda: "G_FLOAT")]
        for n, v in env.items():
            if v.kind == "float":
                c.append((4, lambda n=n: n))
            if v.kind == "obj":
                c.append((2, lambda n=n: f"{n}.scale"))
                c.append((0.5, lambda n=n: f"{n}.doubled"))
        for n, v in self.ints(env):
            c.append((1, lambda n=n: f"({n} * 0.5)"))
        code = self.wchoice(c)()
        if self.p(0.2):
            code = f"({code} * {self.fconst()})"
        return code

    def gen_scalar_operand(self, env):
        if self.p(0.5):
            return self.fconst()
        if self.p(0.5):
            return self.gen_float(env)
        return self.gen_int(env, 0)[0]

    # ------------------------------------------------------------------ tensor expressions
    def leaves(self, env):
        """Tensor-valued leaves: variables and reads of attributes, globals, containers."""
        F, H = self.F, self.H
        out = []
        for n, v in env.items():
            if v.kind == "t":
                out.append((6, E(n, v.shape, v.fresh, leaf=True)))
            elif v.kind == "tlist" and v.min_len >= 1:
                out.append((1, E(f"{n}[{self.choice(['0', '-1'])}]", v.shape, False,
                                 leaf=True)))
                if v.min_len >= 2:
                    out.append((1, E(f"{n}[1]", v.shape, False, leaf=True)))
            elif v.kind == "tdict" and v.keys:
                k = self.choice(sorted(v.keys))
                out.append((1, E(f"{n}[{k!r}]", v.shape, False, leaf=True)))
            elif v.kind == "obj":
                out.append((1, E(f"{n}.buf", (F,), False, leaf=True)))
            elif v.kind == "tup":
                for i, (k, s) in enumerate(v.items):
                    if k == "t":
                        out.append((1, E(f"{n}[{i}]", s, False, leaf=True)))
        out.append((1, E("G_T", (F,), False, leaf=True)))
        out.append((1, E("G_B", ("B", F), False, leaf=True)))
        out.append((1, E("W0", (F, H), False, leaf=True)))
        out.append((0.5, E("W1", (H, F), False, leaf=True)))
        out.append((0.3, E("NET.fc.bias", (H,), False, leaf=True)))
        out.append((0.3, E("OBJ.buf", (F,), False, leaf=True)))
        return out

    def leaf(self, env, pred=None):
        cands = [(w, e) for w, e in self.leaves(env) if pred is None or pred(e.shape)]
        if not cands:
            return None
        return self.wchoice(cands)

    def gen_t(self, env, depth=2):
        """Any tensor expression."""
        e = self.leaf(env)
        if depth <= 0 or self.p(0.25):
            return e
        kind = self.wchoice([(6, "unary"), (6, "binary"), (3, "reduce"), (3, "matmul"),
                             (3, "view"), (3, "slice"), (2, "cat"), (2, "module"),
                             (2, "call"), (1, "liststack"), (1, "where"), (2, "factory"),
                             (2, "pieces"), (1, "dtype")])
        base = self.gen_t(env, depth - 1)
        out = getattr(self, "op_" + kind)(env, base, depth - 1)
        return out if out is not None else base

    def gen_t_exact(self, env, shape, depth=1):
        """A tensor expression of exactly `shape` (None if nothing in scope has it)."""
        shape = tuple(shape)
        e = self.leaf(env, lambda s: tuple(s) == shape)
        if e is None:
            return None
        for _ in range(depth):
            if self.p(0.5):
                e2 = self.op_unary(env, e, 0) if self.p(0.5) else self.op_binary(env, e, 0)
                if e2 is not None:
                    e = e2
        return e

    def gen_bcast(self, env, shape):
        """An operand broadcastable into `shape` (a tensor expression or a Python scalar)."""
        if self.p(0.25):
            return self.gen_scalar_operand(env)
        e = self.leaf(env, lambda s: self.bcast_into(s, shape))
        if e is None or self.p(0.15):
            e2 = self.leaf(env)
            return f"{e2.code}.{self.choice(['sum', 'mean', 'amax'])}()"
        if self.p(0.3):
            e = self.op_unary(env, e, 0) or e
        return e.code

    def op_unary(self, env, e, depth):
        c = e.code
        forms = ["torch.relu({c})", "{c}.sigmoid()", "torch.tanh({c})", "{c}.abs()",
                 "(-{c})", "({c} * {k})", "({c} + {k})", "{c}.clamp(-1.0, 1.0)",
                 "torch.sin({c})", "torch.exp({c}.clamp(max=3.0))", "{c}.pow(2)",
                 "({c} / 2)", "torch.nn.functional.gelu({c})", "{c}.detach()", "{c}.clone()",
                 "({c} * {s})", "obj_apply", "helper", "fnvar", "softmax", "cumsum",
                 "masked", "{c}.flip(0)", "({c} ** 2 + 1).sqrt()", "{c}.float()",
                 "torch.clamp({c}, min={k})", "randlike", "item", "SCALER({c})", "div_s"]
        f = self.choice(forms)
        if f == "obj_apply":
            objs = [n for n, v in env.items() if v.kind == "obj"] + ["OBJ"]
            o = self.choice(objs)
            if len(e.shape) >= 1 and e.shape[-1] == self.F and self.p(0.4):
                return E(f"{o}.mix({c})", e.shape)
            return E(f"{o}.apply({c})", e.shape)
        if f == "helper":
            form = self.r.randrange(5)
            k = self.gen_scalar_operand(env)
            if form == 0:
                return E(f"HELPER({c}, {k})", e.shape)
            if form == 1:
                return E(f"helper_kw({c})", e.shape)
            if form == 2:
                return E(f"helper_kw({c}, {k}, shift={self.fconst()})", e.shape)
            if form == 3:
                return E(f"helper_rec({c}, {self.small_int(env, 3)})", e.shape)
            return E(f"helper_kw({c}, scale={k})", e.shape)
        if f == "fnvar":
            fns = [n for n, v in env.items() if v.kind == "fn"
                   and (v.shape is None or tuple(v.shape) == e.shape)]
            if not fns:
                return E(f"torch.relu({c})", e.shape)
            return E(f"{self.choice(fns)}({c})", e.shape)
        if f == "softmax":
            if not e.shape:
                return E(f"torch.sigmoid({c})", e.shape)
            return E(f"torch.softmax({c}, dim=-1)", e.shape)
        if f == "cumsum":
            if not e.shape:
                return E(f"({c} * 3)", e.shape)
            return E(f"torch.cumsum({c}, dim={self.r.randrange(len(e.shape))})", e.shape)
        if f == "masked":
            if not e.leaf:
                return E(f"torch.relu({c})", e.shape)
            return E(f"{c}.masked_fill({c} < 0, 0.0)", e.shape)
        if f == "{c}.flip(0)" and not e.shape:
            return E(f"({c} - 1)", e.shape)
        if f == "div_s":
            fl = [n for n, v in env.items() if v.kind == "float"]
            return E(f"({c} / {self.choice(fl) if fl else 'G_FLOAT'})", e.shape)
        if f == "randlike":
            if not self.p(0.3):
                return E(f"({c} * 0.75)", e.shape)
            self.features.add("rng")
            return E(f"({c} + torch.randn_like({c}) * 0.1)" if e.leaf
                     else f"({c} * 1.25)", e.shape)
        if f == "item":
            if not self.p(self.break_rate * 10):
                return E(f"({c} + 0.5)", e.shape)
            self.features.add("item")
            src = self.leaf(env)
            return E(f"({c} * {src.code}.sum().item())", e.shape)
        k = self.fconst()
        s = self.gen_scalar_operand(env)
        shares = f in ("{c}.detach()", "{c}.float()")
        return E(f.format(c=c, k=k, s=s), e.shape, fresh=e.fresh if shares else True)

    def op_binary(self, env, e, depth):
        other = self.gen_bcast(env, e.shape)
        f = self.choice(["({a} + {b})", "({a} - {b})", "({a} * {b})", "({b} + {a})",
                         "({b} * {a})", "torch.add({a}, {b}, alpha=0.5)", "{a}.add({b})",
                         "({a} / (abs({b}) + 1))", "torch.mul({a}, {b})", "{a}.sub({b})",
                         "max2"])
        if f == "max2":
            # torch.maximum needs two tensors
            o = self.leaf(env, lambda s: self.bcast_into(s, e.shape))
            if o is not None:
                return E(f"torch.maximum({e.code}, {o.code})", e.shape)
            f = "({a} - {b})"
        return E(f.format(a=e.code, b=other), e.shape)

    def op_factory(self, env, e, depth):
        """New tensors whose sizes and fill values are guarded Python values."""
        F = self.F
        g = self.r.randrange(9)
        if g == 0:
            k = self.small_int(env, 3)
            return E(f"torch.zeros({k}, {F})", (self.tok(0), F))
        if g == 1:
            k = self.small_int(env, 3)
            return E(f"torch.arange({k} + 1).float()", (self.tok(1),))
        if g == 2:
            return E(f"torch.full(({F},), {self.gen_float(env)})", (F,))
        if g == 3:
            return E(f"{e.code}.new_ones({F})", (F,))
        if g == 4:
            return E(f"torch.ones_like({e.code}) * {self.gen_scalar_operand(env)}", e.shape)
        if g == 5:
            return E(f"torch.linspace(0, 1, {F})", (F,))
        if g == 6:
            return E(f"torch.eye({F})", (F, F))
        if g == 7:
            return E(f"torch.tensor([{self.gen_float(env)}, {self.gen_int(env, 0)[0]}])", (2,))
        return E(f"torch.empty({F}).fill_({self.gen_scalar_operand(env)})", (F,))

    def op_pieces(self, env, e, depth):
        """chunk/split/unbind/repeat/roll/narrow/flip/tril/tile."""
        s, c, nd = e.shape, e.code, len(e.shape)
        if nd == 0:
            return None
        g = self.r.randrange(10)
        if g == 0 and isinstance(s[-1], int) and s[-1] >= 2:
            # chunk(2) of an odd size gives pieces of different sizes
            return E(f"{c}.chunk(2, dim=-1)[0]", s[:-1] + ((s[-1] + 1) // 2,), e.fresh)
        if g == 1 and self.dmin(s[0]) >= 1:
            return E(f"torch.split({c}, 1, dim=0)[-1]", (1,) + s[1:], e.fresh)
        if g == 2 and self.dmin(s[0]) >= 1:
            return E(f"{c}.unbind(0)[0]", s[1:], e.fresh)
        if g == 3:
            reps = ", ".join(["2"] + ["1"] * (nd - 1))
            d0 = s[0] * 2 if isinstance(s[0], int) else self.tok(self.dmin(s[0]) * 2)
            return E(f"{c}.repeat({reps})", (d0,) + s[1:])
        if g == 4:
            return E(f"torch.roll({c}, {self.small_int(env, 3)}, 0)", s)
        if g == 5 and isinstance(s[-1], int) and s[-1] >= 2:
            return E(f"{c}.narrow(-1, 1, 1)", s[:-1] + (1,), e.fresh)
        if g == 6:
            return E(f"torch.flip({c}, [0])", s)
        if g == 7 and nd == 2:
            return E(f"{c}.tril()", s)
        if g == 8:
            return E(f"torch.tile({c}, (2,))", s[:-1] + (self.dim_add(s[-1], s[-1]),))
        n = self.small_int(env, 2)
        return E(f"{c}.split({n} + 1, dim=0)[0]", (self.tok(1),) + s[1:], e.fresh)

    def op_dtype(self, env, e, depth):
        """Values of other dtypes: integer and boolean tensors, float64 round trips."""
        s, c, nd = e.shape, e.code, len(e.shape)
        g = self.r.randrange(6)
        if g == 0 and nd >= 1:
            d = self.r.randrange(nd)
            return E(f"{c}.argmax(dim={d})" + (".float()" if self.p(0.6) else ""),
                     s[:d] + s[d + 1:])
        if g == 1 and nd >= 1:
            return E(f"({c} > 0).sum(dim=0)" + (".float()" if self.p(0.6) else ""), s[1:])
        if g == 2:
            return E(f"({c} > 0).float()", s)
        if g == 3:
            return E(f"{c}.double().sin().float()", s)
        if g == 4:
            return E(f"({c} * {self.gen_scalar_operand(env)}).to(torch.float64)", s)
        return E(f"{c}.type_as({self.leaf(env).code})", s)

    def op_where(self, env, e, depth):
        if not e.leaf:
            return self.op_binary(env, e, depth)
        other = self.gen_t_exact(env, e.shape, 0)
        o = other.code if other is not None else "0.0"
        return E(f"torch.where({e.code} > 0, {e.code}, {o})", e.shape)

    def op_reduce(self, env, e, depth):
        if not e.shape:
            return None
        nd = len(e.shape)
        d = self.r.randrange(nd)
        dcode = str(d if self.p(0.6) else d - nd)
        fn = self.choice(["sum", "mean", "amax", "amin", "norm", "logsumexp", "max0", "prod",
                          "std"])
        keep = self.p(0.3)
        shape = list(e.shape)
        if keep:
            shape[d] = 1
        else:
            del shape[d]
        if self.p(0.15):
            return E(f"{e.code}.{self.choice(['sum', 'mean', 'amax'])}()", ())
        kd = ", keepdim=True" if keep else ""
        if fn == "logsumexp":
            return E(f"torch.logsumexp({e.code}, dim={dcode}{kd})", shape)
        if fn == "max0":
            if self.p(0.5):
                return E(f"{e.code}.max(dim={dcode}{kd})[0]", shape)
            return E(f"torch.max({e.code}, {dcode}{kd}).values", shape)
        if fn == "prod":
            return E(f"{e.code}.clamp(-1.5, 1.5).prod(dim={dcode}{kd})", shape)
        if fn == "std":
            if self.dmin(e.shape[d]) < 2:
                fn = "mean"
            else:
                return E(f"{e.code}.std(dim={dcode}{kd})", shape)
        return E(f"{e.code}.{fn}(dim={dcode}{kd})", shape)

    def op_matmul(self, env, e, depth):
        if not e.shape or not isinstance(e.shape[-1], int):
            if len(e.shape) == 2 and e.leaf:
                return E(f"({e.code} @ {e.code}.t())", (e.shape[0], e.shape[0]))
            return None
        K = e.shape[-1]
        ws = []
        for w, l in self.leaves(env):
            if len(l.shape) == 2 and l.shape[0] == K and isinstance(l.shape[1], int):
                ws.append((w, l))
        vs = [(w, l) for w, l in self.leaves(env) if tuple(l.shape) == (K,)]
        if ws and (not vs or self.p(0.75)):
            wt = self.wchoice(ws)
            f = self.choice(["({a} @ {w})", "torch.matmul({a}, {w})", "mm"])
            if f == "mm":
                f = "{a}.mm({w})" if len(e.shape) == 2 else "({a} @ {w})"
            return E(f.format(a=e.code, w=wt.code), e.shape[:-1] + (wt.shape[1],))
        if vs:
            v = self.wchoice(vs)
            return E(f"torch.matmul({e.code}, {v.code})", e.shape[:-1])
        if len(e.shape) == 2 and e.leaf:
            return E(f"({e.code} @ {e.code}.t())", (e.shape[0], e.shape[0]))
        return None

    def op_view(self, env, e, depth):
        s, c, nd = e.shape, e.code, len(e.shape)
        fresh = e.fresh
        opts = ["unsqueeze", "flatten", "reshape-1"]
        if nd == 2:
            opts += ["t", "t", "transpose"]
        if nd >= 2:
            opts += ["transpose", "reshape0", "flatten1", "unflatten"]
        if nd == 3:
            opts += ["permute"]
        if any(d == 1 for d in s):
            opts += ["squeeze", "squeeze"]
        if nd in (1, 2):
            opts += ["expand"]
        opts += ["contiguous", "view-1"]
        f = self.choice(opts)
        if f == "unsqueeze":
            d = self.r.randrange(nd + 1)
            return E(f"{c}.unsqueeze({d})", s[:d] + (1,) + s[d:], fresh)
        if f == "flatten":
            return E(f"{c}.flatten()", (self.dim_prod(s),), fresh)
        if f == "reshape-1":
            return E(f"{c}.reshape(-1)", (self.dim_prod(s),), fresh)
        if f == "view-1":
            # a view of a non-contiguous tensor raises (in both worlds)
            return E(f"{c}.view(-1)", (self.dim_prod(s),), fresh)
        if f == "t":
            return E(f"{c}.t()", (s[1], s[0]), fresh)
        if f == "transpose":
            return E(f"{c}.transpose(-1, -2)", s[:-2] + (s[-1], s[-2]), fresh)
        if f == "reshape0":
            if e.leaf:
                return E(f"{c}.reshape({c}.shape[0], -1)", (s[0], self.dim_prod(s[1:])), fresh)
            if isinstance(s[0], int):
                return E(f"{c}.reshape({s[0]}, -1)", (s[0], self.dim_prod(s[1:])), fresh)
            return None
        if f == "flatten1":
            return E(f"{c}.flatten(1)", (s[0], self.dim_prod(s[1:])), fresh)
        if f == "unflatten":
            last = s[-1]
            if isinstance(last, int) and last % 2 == 0 and last > 2:
                return E(f"{c}.unflatten(-1, (2, {last // 2}))", s[:-1] + (2, last // 2), fresh)
            return E(f"{c}.unsqueeze(-1)", s + (1,), fresh)
        if f == "permute":
            perm = list(range(3))
            self.r.shuffle(perm)
            return E(f"{c}.permute({', '.join(map(str, perm))})", tuple(s[i] for i in perm),
                     fresh)
        if f == "squeeze":
            d = self.choice([i for i, x in enumerate(s) if x == 1])
            return E(f"{c}.squeeze({d})", s[:d] + s[d + 1:], fresh)
        if f == "expand":
            n = self.r.randint(1, 3)
            return E(f"{c}.unsqueeze(0).expand({n}, {', '.join(['-1'] * nd)})", (n,) + s,
                     False)
        return E(f"{c}.contiguous()", s, fresh)

    def op_slice(self, env, e, depth):
        s, c, nd = e.shape, e.code, len(e.shape)
        if nd == 0:
            return None
        fresh = e.fresh
        opts = []
        if self.dmin(s[0]) >= 1:
            opts += ["i0", "im1"]
        if self.dmin(s[0]) >= 2:
            opts += ["from1", "to2", "idx"]
            if "idx" in env:
                opts += ["idxarg", "idxarg"]
        opts += ["step2", "none"]
        if nd >= 2 and self.dmin(s[1]) >= 1:
            opts += ["col0", "lastk"]
        if self.p(self.break_rate * 5):
            opts = ["mask"]
        f = self.choice(opts)
        if f == "i0":
            return E(f"{c}[0]", s[1:], fresh)
        if f == "im1":
            return E(f"{c}[-1]", s[1:], fresh)
        if f == "from1":
            d0 = s[0] - 1 if isinstance(s[0], int) else self.tok(self.dmin(s[0]) - 1)
            return E(f"{c}[1:]", (d0,) + s[1:], fresh)
        if f == "to2":
            d0 = min(s[0], 2) if isinstance(s[0], int) else 2
            return E(f"{c}[:2]", (d0,) + s[1:], fresh)
        if f == "idx":
            self.features.add("adv_index")
            idx = self.choice(["torch.tensor([1, 0])", "[0, 1]", "torch.tensor([0, 1, 0])"])
            n = 3 if idx.count(",") == 2 else 2
            return E(f"{c}[{idx}]", (n,) + s[1:], True)
        if f == "idxarg":
            # an index tensor passed in: out of range in some calls (raises at replay)
            self.features.add("idx_arg")
            form = self.choice(["{c}[idx]", "torch.index_select({c}, 0, idx)",
                                "{c}.index_select(0, idx)"])
            return E(form.format(c=c), (2,) + s[1:], True)
        if f == "step2":
            d0 = (s[0] + 1) // 2 if isinstance(s[0], int) else self.tok((self.dmin(s[0]) + 1) // 2)
            return E(f"{c}[::2]", (d0,) + s[1:], fresh)
        if f == "none":
            return E(f"{c}[None]", (1,) + s, fresh)
        if f == "col0":
            return E(f"{c}[:, 0]", s[:1] + s[2:], fresh)
        if f == "lastk":
            last = s[-1]
            k = self.r.randint(1, 2)
            dl = min(last, k) if isinstance(last, int) else (k if self.dmin(last) >= k
                                                              else self.tok(0))
            return E(f"{c}[..., :{k}]", s[:-1] + (dl,), fresh)
        # a boolean mask: the result's shape depends on the data (the engine breaks)
        self.features.add("mask_index")
        if not e.leaf:
            return E(f"{c}.flatten()[:1]", (1,), fresh)
        return E(f"{c}[{c} > 0]", (self.tok(0),), True)

    def op_cat(self, env, e, depth):
        other = self.gen_t_exact(env, e.shape, 1)
        if other is None:
            other = E(f"torch.zeros_like({e.code})" if e.leaf else f"({e.code}) * 0", e.shape)
        nd = len(e.shape)
        if nd == 0 or self.p(0.35):
            d = self.r.randrange(nd + 1)
            dd = d if self.p(0.7) else d - nd - 1
            fn = self.choice(["torch.stack([{a}, {b}], dim={d})", "torch.stack(({a}, {b}), {d})"])
            return E(fn.format(a=e.code, b=other.code, d=dd), e.shape[:d] + (2,) + e.shape[d:])
        d = self.r.randrange(nd)
        dd = d if self.p(0.7) else d - nd
        shape = list(e.shape)
        shape[d] = self.dim_add(e.shape[d], e.shape[d])
        fn = self.choice(["torch.cat([{a}, {b}], dim={d})", "torch.cat(({a}, {b}), {d})",
                          "torch.concat([{a}, {b}], dim={d})"])
        return E(fn.format(a=e.code, b=other.code, d=dd), shape)

    def op_module(self, env, e, depth):
        if not e.shape or e.shape[-1] != self.F or len(e.shape) > 3:
            if e.shape and e.shape[-1] == self.H and len(e.shape) <= 3:
                return E(f"torch.nn.functional.linear({e.code}, W0)", e.shape[:-1] + (self.F,))
            return None
        mods = [n for n, v in env.items() if v.kind == "mod"] + ["NET"]
        m = self.choice(mods)
        f = self.r.randrange(4)
        if f == 0:
            return E(f"{m}.fc({e.code})", e.shape[:-1] + (self.H,))
        if f == 1:
            return E(f"torch.nn.functional.linear({e.code}, {m}.fc.weight)",
                     e.shape[:-1] + (self.H,))
        return E(f"{m}({e.code})", e.shape[:-1] + (self.H,))

    def op_call(self, env, e, depth):
        return self.op_unary(env, e, depth)

    def op_liststack(self, env, e, depth):
        lists = [(n, v) for n, v in env.items() if v.kind == "tlist" and v.min_len >= 1]
        if not lists:
            return None
        n, v = self.choice(lists)
        if self.p(0.5):
            return E(f"torch.stack({n})", (self.tok(v.min_len),) + tuple(v.shape))
        if not v.shape:
            return E(f"torch.stack({n}).sum(0)", ())
        shape = list(v.shape)
        shape[0] = self.tok(v.min_len * self.dmin(shape[0]))
        return E(f"torch.cat({n})", shape)

    # ------------------------------------------------------------------ conditions
    def gen_cond(self, env):
        """(code, then_updates, else_updates): a condition on guarded Python values, and
        refinements of the environment (e.g. `opt is not None` makes `opt` a tensor)."""
        F = self.F
        c = []
        for n, v in env.items():
            if v.kind == "opt":
                c.append((3, lambda n=n, v=v: (f"{n} is not None",
                                               {n: V("t", v.shape, False)}, {})))
                c.append((2, lambda n=n, v=v: (f"{n} is None", {},
                                               {n: V("t", v.shape, False)})))
                c.append((1, lambda n=n, v=v: (f"isinstance({n}, torch.Tensor)",
                                               {n: V("t", v.shape, False)}, {})))
            elif v.kind == "bool":
                c.append((3, lambda n=n: (self.choice([n, f"not {n}"]), {}, {})))
            elif v.kind == "float":
                c.append((2, lambda n=n: (f"{n} {self.choice(['>', '<', '>='])} "
                                          f"{self.choice(['0.3', '0.5', '1.0'])}", {}, {})))
            elif v.kind == "tlist":
                def lc(n=n, v=v):
                    k = self.r.randint(1, 3)
                    th = v.copy()
                    th.min_len = max(v.min_len, k + 1)
                    return (f"len({n}) > {k}", {n: th}, {})
                c.append((2, lc))
                if v.min_len == 0:
                    def nonempty(n=n, v=v):
                        th = v.copy()
                        th.min_len = 1
                        return (n, {n: th}, {})
                    c.append((2, nonempty))
            elif v.kind == "tdict":
                def kc(n=n, v=v):
                    k = self.choice(["a", "b", "c"])
                    th = v.copy()
                    th.keys = v.keys | {k}
                    return (f"{k!r} in {n}", {n: th}, {})
                c.append((2, kc))
            elif v.kind == "obj":
                c.append((2, lambda n=n: (self.choice([f"{n}.flag", f"not {n}.flag",
                                                       f"{n}.scale > 1.0",
                                                       f"{n}.count % 2 == 0"]), {}, {})))
            elif v.kind == "t" and v.shape:
                c.append((1, lambda n=n, v=v: (self.choice([
                    f"{n}.shape[0] > 2", f"{n}.dim() == {len(v.shape)}",
                    f"{n}.size(-1) == {F}", f"{n}.numel() > 6", f"{n}.shape[-1] % 2 == 0",
                    f"{n}.requires_grad", f"{n}.dtype == torch.float32",
                    f"{n}.is_contiguous()"]), {}, {})))

        def int_cond():
            code, lo, hi = self.gen_int(env)
            a = min(max(lo, 0), 4)
            k = self.r.randint(a, max(a, min(hi, 4)))
            return (f"{code} {self.choice(['>', '<', '==', '!=', '>=', '<='])} {k}", {}, {})
        c.append((4, int_cond))
        c.append((1, lambda: (self.choice(["G_FLAG", "not G_FLAG"]), {}, {})))
        for n, v in self.ints(env):
            c.append((0.3, lambda n=n: (self.choice([f"isinstance({n}, bool)",
                                                     f"type({n}) is int", f"{n} is True",
                                                     f"isinstance({n}, float)"]), {}, {})))
        ts = self.tensors(env, lambda s: len(s) >= 1)
        if len(ts) >= 2:
            (a, va), (b, vb) = self.r.sample(ts, 2)
            c.append((0.5, lambda a=a, b=b: (self.choice([f"{a}.shape == {b}.shape",
                                                          f"tuple({a}.shape) == tuple({b}.shape)",
                                                          f"{a}.shape[1:] == {b}.shape[1:]"]),
                                             {}, {})))
        c.append((1, lambda: (f"G_FLOAT > {self.choice(['0.3', '0.6'])}", {}, {})))
        c.append((1, lambda: ("G_OPT is not None", {"G_OPT": V("t", (F,), False)}, {})))
        c.append((1, lambda: (self.choice(["NET.training", "NET.use_act", "not NET.training"]),
                              {}, {})))
        c.append((0.5, lambda: ("len(G_LOG) > 2", {}, {})))
        if self.p(self.break_rate * 3):
            self.features.add("data_branch")
            e = self.leaf(env)
            return (self.choice([f"{e.code}.sum() > 0", f"bool(({e.code} > 0).any())",
                                 f"{e.code}.mean() < 0.1"]), {}, {})
        code, th, el = self.wchoice(c)()
        if self.p(0.15):
            code2, th2, _ = self.wchoice(c)()
            op = self.choice(["and", "or"])
            if op == "and":
                merged = dict(th)
                merged.update(th2)
                return (f"{code} and {code2}", merged, {})
            return (f"{code} or {code2}", {}, {})
        return code, th, el

    # ------------------------------------------------------------------ statements
    def child_env(self, env, updates=None):
        e = {n: v.copy() for n, v in env.items()}
        if updates:
            for n, v in updates.items():
                e[n] = v
        return e

    def gen_block(self, env, n, depth, loop=False):
        lines = []
        for _ in range(n):
            lines += self.gen_stmt(env, depth, loop)
        return lines or ["pass"]

    def gen_stmt(self, env, depth, loop):
        kinds = [(24, "assign_t"), (8, "update_t"), (6, "inplace"), (4, "assign_int"),
                 (2, "assign_float"), (5, "effect"), (3, "list"), (2, "dict"), (2, "tuple"),
                 (2, "closure"), (2, "comprehension")]
        if depth < 2:
            kinds += [(8, "if"), (5, "for_range"), (4, "for_list"), (2, "for_zip"),
                      (2, "for_dict"), (2, "while")]
        if loop:
            kinds += [(3, "break_continue")]
        kinds += [(0.4, "raise"), (0.4, "assert"), (1.5, "data_check"), (0.8, "pair"),
                  (2, "containers_in"),
                  (1.5, "attrs"), (1, "out_kw"), (1, "strings"), (1, "try"), (1, "print"),
                  (0.8, "warn_log"),
                  (0.6, "data_sizes"), (0.6, "const_tensor"), (0.6, "iter_alias"),
                  (1, "generators"), (0.6, "props"), (0.6, "mappings"), (1, "set"),
                  (1, "pyiter")]
        if depth < 2:
            kinds += [(1, "block")]
        kinds = [(w * BOOST.get(k, 1.0), k) for w, k in kinds]
        if self.p(self.break_rate * 2):
            kinds = [(1, "breaker")]
        kind = self.wchoice(kinds)
        return getattr(self, "st_" + kind)(env, depth, loop)

    def st_assign_t(self, env, depth, loop):
        e = self.gen_t(env, self.r.randint(1, 3))
        n = self.name("t")
        env[n] = V("t", e.shape, e.fresh)
        return [f"{n} = {e.code}"]

    def st_update_t(self, env, depth, loop):
        ts = self.tensors(env)
        n, v = self.choice(ts) if ts else (None, None)
        if n is None:
            return self.st_assign_t(env, depth, loop)
        e = E(n, v.shape, v.fresh, leaf=True)
        e2 = self.op_binary(env, e, 0) if self.p(0.6) else self.op_unary(env, e, 0)
        if self.p(0.3):
            e2 = self.op_unary(env, e2, 0)
        env[n] = V("t", v.shape, True)
        self.note_store(n)
        return [f"{n} = {e2.code}"]

    def st_inplace(self, env, depth, loop):
        fresh = [(n, v) for n, v in self.tensors(env) if v.fresh]
        lines = []
        if fresh and not self.p(0.25):
            n, v = self.choice(fresh)
        else:
            ts = self.tensors(env)
            if ts and self.p(0.5):
                # in-place on something visible to the caller (an input, a view of one)
                n, v = self.choice(ts)
                self.features.add("inplace_input")
            else:
                src = self.gen_t(env, 1)
                n = self.name("b")
                v = V("t", src.shape, True)
                form = self.choice(["{}.clone()", "torch.zeros_like({})", "torch.ones_like({})",
                                    "{} * 1.0"])
                lines.append(f"{n} = " + form.format(src.code))
                env[n] = v
        s = v.shape
        opts = ["add_", "mul_", "clamp_", "iadd", "imul", "copy_", "fill_", "zero_",
                "masked_fill_", "relu_"]
        if s and self.dmin(s[0]) >= 1:
            opts += ["setitem0", "setitem0", "iadd_item"]
        if len(s) >= 2 and self.dmin(s[1]) >= 1:
            opts += ["setcol"]
        f = self.choice(opts)
        b = lambda: self.gen_bcast(env, s)  # noqa: E731
        if f == "add_":
            lines.append(f"{n}.add_({b()})")
        elif f == "mul_":
            lines.append(f"{n}.mul_({b()})")
        elif f == "clamp_":
            lines.append(f"{n}.clamp_(min=-0.5)")
        elif f == "iadd":
            self.note_store(n)
            lines.append(f"{n} += {b()}")
        elif f == "imul":
            self.note_store(n)
            lines.append(f"{n} *= {b()}")
        elif f == "copy_":
            o = self.gen_t_exact(env, s, 1)
            lines.append(f"{n}.copy_({o.code if o is not None else b()})")
        elif f == "fill_":
            lines.append(f"{n}.fill_({self.gen_int(env, 0)[0]})")
        elif f == "zero_":
            lines.append(f"{n}.zero_()")
        elif f == "masked_fill_":
            lines.append(f"{n}.masked_fill_({n} > 0.5, {self.fconst()})")
        elif f == "relu_":
            lines.append(f"{n}.relu_()")
        elif f == "setitem0":
            lines.append(f"{n}[{self.choice(['0', '-1'])}] = {self.gen_bcast(env, s[1:])}")
        elif f == "iadd_item":
            lines.append(f"{n}[0] += {self.gen_bcast(env, s[1:])}")
        elif f == "setcol":
            lines.append(f"{n}[:, 0] = {self.fconst()}")
        return lines

    def st_containers_in(self, env, depth, loop):
        """Methods on the list and dict passed in (the caller sees the changes)."""
        ls = [(n, v) for n, v in env.items() if v.kind == "tlist" and n not in self.iterating]
        ds = [(n, v) for n, v in env.items() if v.kind == "tdict" and n not in self.iterating]
        if ls and (not ds or self.p(0.6)):
            n, v = self.choice(ls)
            g = self.r.randrange(7)
            if g == 0:
                v.min_len = min(v.min_len, 1)
                if v.min_len < 1:
                    return [f"if len({n}) > 1:", f"    {n}.pop()"]
                t = self.name("t")
                env[t] = V("t", v.shape, False)
                return [f"if len({n}) > 1:", f"    {t} = {n}.pop()", "else:",
                        f"    {t} = {n}[0] * 2"]
            if g == 1:
                return [f"{n}.reverse()"]
            if g == 2:
                e = self.gen_t_exact(env, v.shape, 1)
                if e is None:
                    return ["pass"]
                v.min_len += 1
                return [f"{n} += [{e.code}]"]
            if g == 3:
                v.min_len = min(v.min_len, 2)
                return [f"if len({n}) > 2:", f"    del {n}[0]"]
            if g == 4 and v.min_len >= 1:
                h, rest = self.name("t"), self.name("L")
                env[h] = V("t", v.shape, False)
                env[rest] = V("tlist", v.shape, min_len=v.min_len - 1)
                return [f"{h}, *{rest} = {n}"]
            if g == 5:
                e = self.gen_t_exact(env, v.shape, 1)
                if e is None:
                    return ["pass"]
                m = self.name("L")
                env[m] = V("tlist", v.shape, min_len=v.min_len + 1)
                return [f"{m} = {n} + [{e.code}]"]
            k = self.name("k")
            env[k] = V("int", lo=0, hi=8)
            return [f"{k} = len([u for u in {n} if u is {n}[-1]])" if v.min_len >= 1
                    else f"{k} = {n}.count(None)"]
        if ds:
            n, v = self.choice(ds)
            g = self.r.randrange(6)
            if g == 0:
                o = self.name("o")
                env[o] = V("opt", v.shape)
                return [f"{o} = {n}.get({self.choice(['b', 'c', 'a'])!r})"]
            if g == 1:
                v.keys.discard("b")
                return [f"{n}.pop('b', None)"]
            if g == 2:
                e = self.gen_t_exact(env, v.shape, 1)
                if e is None:
                    return ["pass"]
                t = self.name("t")
                env[t] = V("t", v.shape, False)
                v.keys.add("c")
                return [f"{t} = {n}.setdefault('c', {e.code})"]
            if g == 3:
                ks = self.name("ks")
                return [f"{ks} = list({n}.keys())", f"G_LOG.append({ks})"]
            if g == 4:
                e = self.gen_t_exact(env, v.shape, 1)
                if e is None:
                    return ["pass"]
                v.keys.add("z")
                return [f"{n}.update(z={e.code})"]
            k = self.name("k")
            env[k] = V("int", lo=0, hi=6)
            return [f"{k} = len({n}) + ('b' in {n})"]
        return self.st_assign_t(env, depth, loop)

    def st_attrs(self, env, depth, loop):
        """hasattr/getattr with a default/del on objects passed in."""
        objs = [n for n, v in env.items() if v.kind == "obj"] + ["OBJ"]
        o = self.choice(objs)
        g = self.r.randrange(5)
        if g == 0:
            t = self.name("t")
            env[t] = V("t", (self.F,), True)
            return [f"if hasattr({o}, 'last') and isinstance({o}.last, torch.Tensor):",
                    f"    {t} = {o}.last.sum() + {o}.buf", "else:", f"    {t} = {o}.buf * 2"]
        if g == 1:
            return [f"if hasattr({o}, 'tag'):", f"    del {o}.tag"]
        if g == 2:
            k = self.name("k")
            env[k] = V("int", lo=0, hi=12)
            return [f"{k} = getattr({o}, 'count', 0) + len(getattr({o}, 'history', []))"]
        if g == 3:
            e = self.gen_t_exact(env, (self.F,), 1)
            if e is None:
                return [f"{o}.buf.add_(1.0)"]
            self.features.add("inplace_attr")
            return [f"{o}.buf.add_({e.code})" if self.p(0.5) else f"{o}.buf[0] = {e.code}[0]"]
        return [f"setattr({o}, 'tag', {self.gen_int(env)[0]})"]

    def st_out_kw(self, env, depth, loop):
        a = self.gen_t(env, 1)
        b = self.gen_bcast(env, a.shape)
        t = self.name("t")
        env[t] = V("t", a.shape, True)
        b = f"torch.as_tensor({b}).detach()"
        return [f"{t} = torch.empty(0)",
                f"torch.{self.choice(['add', 'mul', 'sub'])}({a.code}.detach(), {b}, out={t})"]

    def st_strings(self, env, depth, loop):
        k = self.gen_int(env)[0]
        g = self.r.randrange(4)
        if g == 0:
            e = self.gen_t(env, 1)
            return [f'G_CACHE[f"k{{{k}}}"] = {e.code}']
        if g == 1:
            return [f'G_LOG.append(f"{{{k}}}:{{{self.gen_float(env)}}}")']
        if g == 2:
            e = self.leaf(env)
            return [f"G_LOG.append(str({e.code}.shape) + {e.code}.dtype.__repr__())"
                    if self.p(0.3) else f"G_LOG.append(tuple({e.code}.shape))"]
        return [f"G_LOG.append('n=%d' % {k})"]

    def st_print(self, env, depth, loop):
        # debug prints (the runner compares what each world printed): replayed as steps when
        # their text follows from replayed values, a break otherwise ([Note: print])
        self.features.add("print")
        k = self.gen_int(env)[0]
        e = self.leaf(env)
        g = self.r.randrange(6)
        if g == 0:
            return [f'print("shape", {e.code}.shape, {e.code}.dim(), {e.code}.dtype)']
        if g == 1:
            return [f'print(f"[dbg] k={{{k}}} n={{{e.code}.numel()}}", sep="", end=";\\n")']
        if g == 2:  # a size read from data (a mask's length)
            return [f'print("kept", len({e.code}[{e.code} > 0]), [{k}, "of", {e.code}.numel()])']
        if g == 3:  # a tensor printed (ints: a compiled backend may round floats differently)
            return [f"print(({e.code}.detach() * 0 + {k}).int())"]
        if g == 4:  # an object with its own __str__: a break
            return ["print(OBJ)" if self.p(0.5) else f"print({k}, file=_SINK)"]
        return [f"print(tuple({e.code}.shape), {{'k': {k}}})"]

    def st_warn_log(self, env, depth, loop):
        # warnings and log records name the caller's file and line (the runner compares what
        # each world warned, G_RECORDS what it logged): replayed as steps from that site
        # ([Note: effects that read the caller's frame])
        self.features.add("warn_log")
        k = self.gen_int(env)[0]
        e = self.leaf(env)
        g = self.r.randrange(9)
        if g == 7:  # filed by the op's C++ code, at the frame running it ([Note: site frames])
            return [f"_copied = torch.tensor({e.code}) * 2"]
        if g == 8:
            return [f"_wide = {e.code}.clone()[None].expand(2, *{e.code}.shape)",
                    f"_wide.masked_fill_(_wide > 0.5, {self.fconst()})"]
        if g == 0:
            return [f'warnings.warn(f"deprecated k={{{k}}}", DeprecationWarning)']
        if g == 1:  # the runner's line, or the line above it
            return [f'warnings.warn("from the caller", FutureWarning, '
                    f'stacklevel={self.r.randint(2, 3)})']
        if g == 2:
            return [f'_LOG.info("k=%d shape=%s", {k}, tuple({e.code}.shape))']
        if g == 3:
            return [f'_LOG.debug("hidden %d", {k})', '_LOG.warning("up", stacklevel=2)']
        if g == 4:
            return [f'_LOG.log(logging.ERROR, "n=%s", {e.code}.numel(), extra={{"tag": {k}}})']
        if g == 5:  # not replayed: a break that runs in the frame
            return ['_LOG.info("with the stack", stack_info=True)']
        return [f'warnings.warn("shape %s" % (tuple({e.code}.shape),), UserWarning)']

    def st_try(self, env, depth, loop):
        e = self.gen_t(env, 1)
        t = self.name("t")
        env[t] = V("t", e.shape, True)
        bad, exc = self.choice([("G_LOG[100]", "IndexError"), ("G_CACHE['missing']", "KeyError"),
                                (f"{e.code}.view(-1, 7)", "RuntimeError"),
                                (f"{e.code}.shape", "ValueError")])
        if self.p(0.3):
            exc = self.choice(["IndexError", "RuntimeError", "KeyError", "Exception",
                               "LookupError"])
        if "idx" in env and self.p(0.6):
            # raises only in the calls whose index tensor is out of range
            exc = self.choice(["IndexError", "Exception"])
            bad = self.choice(["x[idx]", "x.index_select(0, idx)", "x[idx].sum()"])
        elif self.p(0.4):
            # raises only for some data (the size of a masked selection)
            exc = self.choice(["RuntimeError", "Exception"])
            bad = f"x[x > 0].view(-1, {self.choice(['2', '3', '4'])})"
            if self.p(0.4):  # in a callee that breaks first: compiled on its own in the handler's
                bad = f"helper_noisy({e.code}, {self.gen_scalar_operand(env)})"  # frame
        target = self.name('z')
        if bad.endswith(".shape"):  # unpacking: raises for the ranks that are not 2
            target = f"{target}, {self.name('z')}"
        return ["try:", f"    {t} = {e.code} * 2", f"    {target} = {bad}",
                f"except {exc}:", f"    {t} = {e.code} - 1"]

    def st_block(self, env, depth, loop):
        """A `with` block over one of torch's context managers, or a try/except/finally, around
        a generated body that often breaks: capture resumes inside the with block, and a break
        the handler could see goes on in the frame ([Note: breaks inside with blocks])."""
        self.features.add("block")
        benv = self.child_env(env)
        body = []
        if self.p(0.6):
            body += self.st_breaker(benv, depth + 1, loop)
        body += self.gen_block(benv, self.r.randint(1, 3), depth + 1, loop)
        if self.p(0.3):
            body += self.st_breaker(benv, depth + 1, loop)
        self._merge_back(env, benv)
        if self.p(0.6):
            head = self.choice(["torch.no_grad()", "torch.enable_grad()",
                                "torch.set_grad_enabled(G_FLAG)", "torch.inference_mode(False)",
                                "torch.autocast('cpu', enabled=False)",
                                "torch.autocast('cpu', dtype=torch.bfloat16, enabled=G_FLAG)"])
            lines = [f"with {head}:"] + indent(body)
            if self.p(0.3):
                lines.append("G_LOG.append(torch.is_grad_enabled())")
            return lines
        exc = self.choice(["RuntimeError", "IndexError", "(KeyError, ValueError)", "Exception"])
        lines = ["try:"] + indent(body) + [f"except {exc} as err:",
                                           "    G_LOG.append(type(err).__name__)"]
        if self.p(0.5):
            lines += ["finally:", f"    G_LOG.append(('fin', {self.gen_int(env)[0]}))"]
        return lines

    def st_data_sizes(self, env, depth, loop):
        """A size that depends on data reached through a container (torch.cat of a list that
        holds a masked selection, a dict of them, a generator over them): a branch on it is
        guessed and checked at replay, and breaks once it went the other way ([Note: speculated
        branches]); never specialised to the size one call happened to have. Each condition
        compares the data-dependent count with half the elements, so it goes both ways. Before
        it, sometimes a draw and a write into memory the call made, or a write of an attribute,
        a dict item or a global: the plan may still give up at the check, putting the generators
        back ([Note: draws before a check]) and the writes ([Note: writes undone])."""
        self.features.add("data_sizes")
        leaf_b = self.leaf(env)
        a, b = self.leaf(env).code, leaf_b.code
        parts = self.name("parts")
        before = []
        if self.r.randrange(3) == 0:
            noise, buf = self.name("t"), self.name("t")
            before = [f"{noise} = torch.randn_like({b})", f"{buf} = torch.zeros_like({b})",
                      f"{buf}[0] = 1.0", f"{noise} = {noise} + {buf}"]
            env[noise] = V("t", leaf_b.shape, True)
        w = self.r.randrange(6)
        if w == 0:
            o = self.choice([n for n, v in env.items() if v.kind == "obj"] + ["OBJ"])
            before.append(f"{o}.tag = getattr({o}, 'tag', 0) + {b}.sum()")
        elif w == 1:
            before.append(f"G_CACHE['seen'] = G_CACHE.get('seen', 0) + {b}.sum()")
        elif w == 2:
            self.global_writes.add("G_T")
            before.append("G_T = G_T + 1")
        half = f"{a}.numel() // 2"
        g = self.r.randrange(6)
        if g == 5:
            # a loop over a masked selection: unrolled on a guess of its length, checked at
            # replay, a break once it changed (torchvision's loop over torch.unique(labels))
            acc, row = self.name("t"), self.name("u")
            env[acc] = V("t", (), True)
            src = self.choice([f"{a}[{a} > 0]", f"torch.unique(({a} * 2).round())",
                               f"{a}.flatten().nonzero()"])
            return before + [f"{acc} = {b}.sum() * 0", f"for {row} in {src}:",
                             f"    {acc} = {acc} + {row}.sum()"]
        if g == 4:
            # ops on a masked selection keep a length that depends on data: every size read
            # from the result is the one of this call (fuzz seed 113647: `-x[x > 0]`)
            e = E(f"{a}[{a} > 0]", ("?",), leaf=False)
            for _ in range(self.r.randrange(1, 4)):
                e = self.op_unary(env, e, depth)
            size = self.choice(["{u}.size(0)", "len({u})", "{u}.shape[0]", "{u}.numel()",
                                "tuple({u}.unsqueeze(0).shape)", "{u}.view(-1, 1).size(0)"])
            return before + [f"G_LOG.append({size.format(u=e.code)})"]
        if g == 0:
            lines = [f"{parts} = [{a}[{a} > 0], {b}.flatten()]",
                     f"if torch.cat({parts}).numel() > {b}.numel() + {half}:"]
        elif g == 1:
            lines = [f"{parts} = {{'kept': {a}[{a} < 0], 'all': {b}.flatten()}}",
                     f"if len(torch.cat(list({parts}.values()))) >= {b}.numel() + {half}:"]
        elif g == 2:
            lines = [f"{parts} = ({a}.flatten()[{a}.flatten() < 0], {b}.flatten())",
                     f"if sum(p.numel() for p in {parts}) > {b}.numel() + {half}:"]
        else:
            lines = [f"{parts} = []",
                     f"{parts}.append({a}[{a} > 0])",
                     f"if torch.stack([{parts}[0].sum(), {b}.sum()]).numel() == 2 and "
                     f"torch.cat({parts}).shape[0] < {half}:"]
        return before + lines + ["    print('many')", "else:", "    print('few')"]

    def st_iter_alias(self, env, depth, loop):
        """A loop over an iterator a local also names, a graph break inside it (a branch on data,
        or an object's __str__ printed), then the rest of the iterator read after the loop: the
        resumed loop and the local must go on as one object, where the loop left it ([Note:
        iterators passed in])."""
        lists = [(n, v) for n, v in env.items() if v.kind == "tlist" and n not in self.iterating]
        if not lists:
            return self.st_assign_t(env, depth, loop)
        self.features.add("iter_alias")
        n, v = self.choice(lists)
        it, x, y, t = self.name("it"), self.name("u"), self.name("u"), self.name("t")
        src = self.choice([f"iter({n})", f"iter(tuple({n}))", f"enumerate({n})",
                           f"zip({n}, {n}[1:] + {n}[:1])"])
        item = {"e": f"{x}[1]", "z": f"{x}[0] - {x}[1]"}.get(src[0], x)
        stop = self.choice([f"    if ({item}).sum() > 0:", "    if len(str(Obj())) > 0:"])
        env[t] = V("t", (), True)
        return [f"{it} = {src}",
                f"{t} = torch.zeros(())",
                f"for {x} in {it}:",
                f"    {t} = {t} + ({item}).sum()",
                stop,
                "        break",
                f"for {y} in {it}:",
                f"    {t} = {t} * 0.5 + ({item.replace(x, y)}).sum()"]

    def st_generators(self, env, depth, loop):
        """Python generators: consumed by a loop, sum, list, zip of two, a comprehension, or
        partly by next(); some write to G_LOG or OBJ as they go, print, or break inside
        ([Note: generators])."""
        self.features.add("generators")
        e = self.leaf(env)
        n = self.name("t")
        gen = self.wchoice([(4, "gen_scaled"), (2, "gen_logged"), (2, "gen_from"),
                            (1, "gen_printing"), (1, "gen_bump"),
                            (self.break_rate * 20, "gen_item")])
        k = self.small_int(env, 3)
        g = self.r.randrange(7)
        if g == 6:  # a generator made early and read after more statements
            it = self.name("it")
            body = self.gen_block(env, self.r.randint(1, 2), depth + 1, loop)
            env[n] = V("t", e.shape, True)
            return [f"{it} = {gen}({e.code}, {k})"] + body + [
                f"{n} = {e.code} + sum(v.sum() for v in {it})"]
        env[n] = V("t", e.shape, True)
        if g == 0:
            u = self.name("u")
            return [f"{n} = {e.code} * 0",
                    f"for {u} in {gen}({e.code}, {k}):",
                    f"    {n} = {n} + {u}"]
        if g == 1:
            return [f"{n} = sum({gen}({e.code}, {k}), torch.zeros_like({e.code}))"]
        if g == 2:
            return [f"{n} = torch.stack(list({gen}({e.code}, {k})) + [{e.code}]).sum(0)"]
        if g == 3:
            other = self.gen_t_exact(env, e.shape, 1) or e
            a, b = self.name("u"), self.name("u")
            return [f"{n} = {e.code} * 1",
                    f"for {a}, {b} in zip({gen}({e.code}, {k}), "
                    f"gen_scaled({other.code}, {self.small_int(env, 3)})):",
                    f"    {n} = {n} + {a} * {b}"]
        if g == 4:
            it = self.name("it")
            return [f"{it} = {gen}({e.code}, {k})",
                    f"{n} = next({it}, {e.code})",
                    f"{n} = {n} + next({it}, {e.code} * 2)"]
        u = self.name("u")
        cond = self.choice(["True", f"{u}.sum() > 0", f"{u}.dim() > 0"])
        return [f"{n} = torch.stack([{u}.relu() for {u} in {gen}({e.code}, {k}) "
                f"if {cond}] + [{e.code}]).mean(0)"]

    def st_props(self, env, depth, loop):
        """Properties of user classes: a getter on an object passed in or OBJ, a setter, and a
        functools.cached_property on an object made in the call (read twice)."""
        self.features.add("props")
        objs = [m for m, v in env.items() if v.kind == "obj"] + ["OBJ"]
        o = self.choice(objs)
        g = self.r.randrange(4)
        if g == 0:
            s = self.name("s")
            env[s] = V("float")
            return [f"{s} = {o}.doubled + {o}.level"]
        if g == 1:
            return [f"{o}.level = {o}.level + {self.small_int(env, 2)}"]
        e = self.leaf(env)
        st, n = self.name("st"), self.name("t")
        env[n] = V("t", e.shape, True)
        lines = [f"{st} = Stats({e.code})",
                 f"{n} = {e.code} * {st}.total + {st}.total"]
        if g == 3:
            lines.append(f"{n} = {n} + {st}.total * 0.5 if {st}.total > 0 else {n}")
        return lines

    def st_mappings(self, env, depth, loop):
        """Objects of dict subclasses and of classes with their own __setattr__/__setitem__/
        __getitem__, made in the call: a ModelOutput-style Result read by key, position and
        attribute, written after it escaped to G_LOG; a Bag(dict) with items set and iterated;
        a Tracked object whose __setattr__ records names ([Note: hooks of objects made in the
        call])."""
        self.features.add("mappings")
        e = self.leaf(env)
        other = self.gen_t_exact(env, e.shape, 1) or e
        n, o = self.name("t"), self.name("o")
        env[n] = V("t", e.shape, True)
        g = self.r.randrange(13)
        if g == 12:  # a context manager class of the program's own ([Note: user context managers])
            k = self.name("k")
            cm = self.choice([f"Scope(G_LOG, {self.small_int(env, 3)})", "G_SCOPE"])
            body = self.choice([f"{e.code} * {k}", f"{e.code} * OBJ.scale + {k}",
                                f"{e.code}[:G_INT + 1].sum() * {k} + {e.code}"])
            lines = [f"with {cm} as {k}:", f"    {n} = {body}"]
            if self.p(0.3):  # a break inside the block: the rest resumes inside it
                lines += [f"    if {n}.sum() > 0:", f"        {n} = {n} + 1",
                          f"    {n} = {n}[:G_INT + 2] * 2 if G_INT < 2 else {n}"]
            return lines
        if g == 9:  # a @contextmanager block of the program's own
            nm = self.name("nm")
            label = self.choice(["'a'", "'bc'"])
            return [f"with logged(G_LOG, {label}) as {nm}:",
                    f"    {n} = {e.code} * len({nm})",
                    f"with maybe_no_grad({self.choice(['True', 'False', 'G_FLAG'])}):",
                    f"    {n} = {n} + {other.code}"]
        if g == 10:  # an object with __slots__ made in the call
            sl = self.name("sl")
            return [f"{sl} = Slots2({e.code}, {self.small_int(env, 3)})",
                    f"{sl}.b = {sl}.b + 1",
                    f"{n} = {sl}.a * {sl}.b"]
        if g == 11:  # numbers read from data through tolist()
            ls = self.name("ls")
            return [f"{ls} = ({other.code}.detach().flatten()[:2].abs() * 3).long().tolist()",
                    f"{n} = {e.code} * (sum({ls}) + 1) + {ls}[0]"]
        if g == 7:  # grouping with a defaultdict made in the call
            dd = self.name("dd")
            lines = [f"{dd} = collections.defaultdict(list)",
                     f"{dd}['a'].append({e.code})", f"{dd}['b'].append({other.code})",
                     f"{dd}['a'].append({e.code} * 2)",
                     f"{n} = torch.stack({dd}['a']).sum(0) + len({dd}['missing'])"]
            if self.p(0.5):
                lines.append(f"G_LOG.append({dd})")
            return lines
        if g == 8:  # copies of a dict passed in, changed after the copy
            c = self.name("c")
            how = self.choice(["DCT.copy()", "copy.copy(DCT)", "dict(DCT)"])
            return [f"{c} = {how}", f"{c}['z'] = {e.code}",
                    f"{n} = {e.code} * len({c}) + {c}['z']"]
        if g == 6:  # a numpy array passed in: dtype, layout and data change between calls
            env[n] = V("t", (self.F,), True)
            a = self.name("a")
            return [f"{a} = torch.from_numpy(G_NP)",
                    f"{n} = {a}.float() * 2 if {a}.dtype == torch.float64 else {a}.float() + 1",
                    f"{n} = {n} + torch.as_tensor(G_NP, dtype=torch.float32)"]
        if g == 5:  # a ModelOutput passed in (a global the caller changes between calls)
            env[n] = V("t", (self.F,), True)
            read = self.choice(["G_OUT[0]", "G_OUT[-1]", "G_OUT['main']", "G_OUT.main"])
            lines = [f"{n} = {read} + (G_OUT.aux if 'aux' in G_OUT else 0) * len(G_OUT)"]
            if self.p(0.4):  # written through its hooks, then read again
                lines.append(self.choice([f"G_OUT['main'] = {n} * 0.5", f"G_OUT.aux = {n} + 1",
                                          "G_OUT.note = len(G_OUT)"]))
                lines.append(f"{n} = {n} + G_OUT.main - G_OUT[0]")
            return lines
        if g == 0:
            aux = self.choice(["None", f"{other.code} * 2"])
            return [f"{o} = Result(main={e.code}, aux={aux})",
                    f"{n} = {o}[0] + {o}.main + ({o}['aux'] if {o}.aux is not None else 0)",
                    f"{n} = {n} * len({o})"]
        if g == 1:
            return [f"{o} = Result(main={e.code})",
                    f"{o}['aux'] = {other.code} + 1",
                    f"{n} = {o}[-1] + {o}.aux * {len('x')}" + (
                        f" + sum(v.sum() for v in {o}.values())" if self.p(0.5) else "")]
        if g == 2:  # escapes, then changes where the caller sees it
            return [f"{o} = Result(main={e.code}, aux=None)",
                    f"G_LOG.append({o})",
                    f"{o}['aux'] = {other.code} * {self.small_int(env, 3)}",
                    f"{o}.main = {o}.main + 1",
                    f"{n} = {o}[1] + {o}.main"]
        if g == 3:
            k = self.small_int(env, 3)
            return [f"{o} = Bag(x={e.code}, n={k})",
                    f"{o}['y'] = {other.code} * {o}['n']",
                    f"{n} = {o}.total() + len({o}) + {o}.get('z', 0)",
                    f"G_LOG.append([k for k in {o}])" if self.p(0.5) else f"{o}.pop('n')",
                    f"G_LOG.append({o})" if self.p(0.5) else "pass"]
        lines = [f"{o} = Tracked({e.code})",
                 f"{o}.u = {o}.t * {self.small_int(env, 3)}",
                 f"{n} = {o}.u + {o}.t"]
        if self.p(0.5):
            lines += [f"G_LOG.append({o})", f"{o}.v = {len(lines)}"]
        return lines

    def st_const_tensor(self, env, depth, loop):
        """Tensors computed from constants (shapes, ints): Python reading their data folds to a
        constant, unless data reached them (an in-place change through a view), where it must
        be read at replay or break ([Note: tensors of constants])."""
        self.features.add("const_tensor")
        e = self.leaf(env).code
        k = self.gen_int(env)[0]
        c = self.name("c")
        g = self.r.randrange(4)
        if g == 0:
            return [f"{c} = torch.tensor({e}.shape, dtype=torch.float32)",
                    f"print('numel', {c}.prod().item(), int({c}.sum()))"]
        if g == 1:
            return [f"{c} = torch.tensor([{k}, 3])",
                    f"if {c}.max() > 3:",
                    f"    print('k', {c}.tolist())",
                    "else:",
                    f"    print('small', int({c}[0]))"]
        if g == 2:  # data written through a view: no longer a constant
            return [f"{c} = torch.arange(4.0)",
                    f"{c}[1:].add_({e}.flatten()[0].detach())",
                    f"if {c}[2] > 2:",
                    "    print('above')",
                    "else:",
                    "    print('below')"]
        return [f"{c} = torch.tensor({e}.shape).tolist()",
                f"{c}.append({k})",
                f"print('dims', {c}, len({c}))"]

    def note_store(self, n):
        """A store to a bare module-level name makes it global in fn."""
        if n.isidentifier() and n.isupper():
            self.global_writes.add(n)

    def st_assign_int(self, env, depth, loop):
        code, lo, hi = self.gen_int(env)
        n = self.name("k")
        env[n] = V("int", lo=lo, hi=hi)
        return [f"{n} = {code}"]

    def st_assign_float(self, env, depth, loop):
        code = self.gen_float(env)
        n = self.name("s")
        env[n] = V("float")
        return [f"{n} = {code}"]

    def st_effect(self, env, depth, loop):
        F = self.F
        opts = ["log_t", "log_int", "cache", "g_int", "g_float", "g_t", "g_flag", "obj",
                "obj", "lst", "dct", "net_flag", "g_opt"]
        f = self.choice(opts)
        if f == "log_t":
            e = self.gen_t(env, 1)
            return [f"G_LOG.append({e.code})"]
        if f == "log_int":
            return [f"G_LOG.append({self.gen_int(env)[0]})"]
        if f == "cache":
            e = self.gen_t(env, 1)
            key = self.choice(["'last'", "'k'", "'out'"])
            env[f"G_CACHE[{key}]"] = V("t", e.shape, False)
            return [f"G_CACHE[{key}] = {e.code}"]
        if f == "g_int":
            self.global_writes.add("G_INT")
            return [self.choice(["G_INT += 1", "G_INT = G_INT + 1", "G_INT = (G_INT * 2) % 5",
                                 f"G_INT = {self.small_int(env, 4)}"])]
        if f == "g_float":
            self.global_writes.add("G_FLOAT")
            return [self.choice(["G_FLOAT = G_FLOAT * 0.5", "G_FLOAT += 0.25",
                                 f"G_FLOAT = {self.gen_float(env)}"])]
        if f == "g_t":
            self.global_writes.add("G_T")
            o = self.gen_t_exact(env, (F,), 1)
            if o is None or self.p(0.3):
                return ["G_T = G_T * 0.5 + 1.0"]
            return [f"G_T = G_T + {o.code}.detach()" if self.p(0.5) else f"G_T = {o.code}"]
        if f == "g_flag":
            self.global_writes.add("G_FLAG")
            return ["G_FLAG = not G_FLAG"]
        if f == "g_opt":
            self.global_writes.add("G_OPT")
            o = self.gen_t_exact(env, (F,), 0)
            return [f"G_OPT = {o.code if o is not None and self.p(0.5) else 'None'}"]
        if f == "net_flag":
            return [self.choice(["NET.use_act = not NET.use_act", "NET.calls += 1",
                                 f"NET.use_act = {self.choice(['True', 'False'])}"])]
        if f == "obj":
            objs = [n for n, v in env.items() if v.kind == "obj"] + ["OBJ"]
            o = self.choice(objs)
            g = self.r.randrange(8)
            if g == 0:
                return [f"{o}.count += 1"]
            if g == 1:
                return [f"{o}.scale = {o}.scale * 0.5 + {self.gen_float(env)}"]
            if g == 2:
                e = self.gen_t_exact(env, (F,), 1)
                if e is not None:
                    return [f"{o}.buf = {e.code}.detach()"]
                return [f"{o}.buf = {o}.buf * 2"]
            if g == 3:
                e = self.gen_t(env, 1)
                env[f"{o}.last"] = V("t", e.shape, False)
                return [f"{o}.last = {e.code}"]
            if g == 4:
                n = self.name("k")
                env[n] = V("int", lo=1, hi=12)
                return [f"{n} = {o}.bump()"]
            if g == 5:
                return [f"{o}.flag = {self.gen_cond(env)[0]}"]
            if g == 6:
                return [f"{o}.history.append({self.gen_int(env)[0]})"]
            return [f"{o}.tag = {self.choice(['None', repr('x'), '(1, 2)', '[1]'])}"]
        if f == "lst":
            ls = [(n, v) for n, v in env.items() if v.kind == "tlist" and v.ext
                  and n not in self.iterating]
            if not ls:
                return [f"G_LOG.append({self.gen_int(env)[0]})"]
            n, v = self.choice(ls)
            e = self.gen_t_exact(env, v.shape, 1)
            if e is None:
                return [f"G_LOG.append(len({n}))"]
            g = self.r.randrange(3)
            if g == 0 or v.min_len == 0:
                return [f"{n}.append({e.code})"]
            if g == 1:
                return [f"{n}[0] = {e.code}"]
            return [f"{n}.insert(0, {e.code})"]
        if f == "dct":
            ds = [(n, v) for n, v in env.items() if v.kind == "tdict" and v.ext
                  and n not in self.iterating]
            if not ds:
                return [f"G_CACHE['n'] = {self.gen_int(env)[0]}"]
            n, v = self.choice(ds)
            e = self.gen_t_exact(env, v.shape, 1)
            if e is None:
                return [f"G_CACHE['d'] = len({n})"]
            k = self.choice(["a", "b", "c", "z"])
            v.keys.add(k)
            return [f"{n}[{k!r}] = {e.code}"]
        return ["pass"]

    def st_list(self, env, depth, loop):
        e = self.gen_t(env, 1)
        n = self.name("L")
        g = self.r.randrange(4)
        lines = []
        if g == 0:
            lines.append(f"{n} = []")
            env[n] = V("tlist", e.shape, min_len=0)
        elif g == 1:
            o = self.gen_t_exact(env, e.shape, 1) or e
            lines.append(f"{n} = [{e.code}, {o.code}]")
            env[n] = V("tlist", e.shape, min_len=2)
        elif g == 2:
            lines.append(f"{n} = [{e.code}]")
            env[n] = V("tlist", e.shape, min_len=1)
        else:
            srcs = [(m, v) for m, v in env.items() if v.kind == "tlist"]
            if srcs:
                m, v = self.choice(srcs)
                form = self.choice(["list({m})", "{m}[:]", "{m} + []", "{m}[1:]", "{m}.copy()"])
                ml = max(0, v.min_len - 1) if form == "{m}[1:]" else v.min_len
                lines.append(f"{n} = {form.format(m=m)}")
                env[n] = V("tlist", v.shape, min_len=ml)
            else:
                lines.append(f"{n} = [{e.code}]")
                env[n] = V("tlist", e.shape, min_len=1)
        # then a few operations on it
        v = env[n]
        for _ in range(self.r.randint(0, 2)):
            o = self.gen_t_exact(env, v.shape, 1)
            if o is None:
                break
            g = self.r.randrange(4)
            if g == 0:
                lines.append(f"{n}.append({o.code})")
                v.min_len += 1
            elif g == 1:
                lines.append(f"{n}.extend([{o.code}, {o.code} * 2])")
                v.min_len += 2
            elif g == 2 and v.min_len >= 1:
                t = self.name("t")
                lines.append(f"{t} = {n}.pop()")
                env[t] = V("t", v.shape, False)
                v.min_len -= 1
            else:
                lines.append(f"{n}.insert(0, {o.code})")
                v.min_len += 1
        return lines

    def st_set(self, env, depth, loop):
        """A set of guarded ints made in the call: built, changed, stored (then changed: a
        break), asked (in, len, operators, iteration); an int of it for later statements."""
        a, b = self.gen_int(env)[0], self.gen_int(env)[0]
        n = self.name("S")
        lines = [self.choice([f"{n} = {{{a}, {b}}}", f"{n} = set(({a}, {b}))", f"{n} = set()",
                              f"{n} = {{v % 3 for v in ({a}, {b}, 4)}}"])]
        for _ in range(self.r.randint(0, 3)):
            c = self.gen_int(env)[0]
            lines.append(self.choice([f"{n}.add({c})", f"{n}.discard({c})",
                                      f"{n} |= {{{c}, 7}}", f"{n} = {n} - {{{c}}}",
                                      f"{n}.update(({c}, 1))", "G_LOG.append({n})".format(n=n)]))
        k = self.name("k")
        code, lo, hi = self.choice([
            (f"len({n})", 0, 6), (f"(2 if {a} in {n} else 0)", 0, 2),
            (f"len({n} & {{0, 1, 2}})", 0, 3), (f"sum({n}) % 7", 0, 6),
            (f"len([v for v in sorted({n}) if v > 0])", 0, 6),
            (f"int({n} == {{{a}, {b}}})", 0, 1)])
        lines.append(f"{k} = {code}")
        env[k] = V("int", lo=lo, hi=hi)
        return lines

    def st_pyiter(self, env, depth, loop):
        """itertools, collections.Counter, operator getters and sentinels over guarded ints and
        tensors: an int for later statements, or a tensor made from several."""
        a, b, c = (self.gen_int(env)[0] for _ in range(3))
        k = self.name("k")
        ints = [
            (f"sum(itertools.accumulate(({a}, {b}, 1)))", 1, 40),
            (f"len(list(itertools.islice(({a}, {b}, {c}, 1), 1, None, 2)))", 0, 2),
            (f"sum(p * q for p, q in itertools.pairwise(({a}, {b}, {c})))", 0, 99),
            (f"sum(p * q for p, q in itertools.zip_longest(({a}, {b}), ({c},), fillvalue=2))", 0, 99),
            (f"collections.Counter(({a}, {b}, {a}, {c}))[{a}]", 1, 3),
            (f"collections.Counter(({a} % 2, {b} % 2, 1)).most_common(1)[0][1]", 1, 3),
            (f"max(((0, {a}), (1, {b}), (2, {c})), key=operator.itemgetter(1))[0]", 0, 2),
            (f"sorted({{'p': {a}, 'q': {b}}}.items(), key=operator.itemgetter(1))[0][1]", 0, 12),
            (f"sum(itertools.chain(({a},), ({b}, {c})))", 0, 36),
            (f"len(list(itertools.combinations_with_replacement(range({a} % 3 + 1), 2)))", 1, 6),
        ]
        ts = self.tensors(env)
        if ts and self.p(0.4):
            n, v = self.choice(ts)
            o = self.gen_t_exact(env, v.shape, 1)
            if o is not None:
                t = self.name("t")
                env[t] = V("t", v.shape, True)
                code = self.choice([
                    f"sum(itertools.starmap(lambda u, w: u * w, (({n}, {a}), ({o.code}, 2))))",
                    f"sum(reversed([{n}, {o.code}]))",
                    f"operator.itemgetter(1)([{n}, {o.code}]) + sum(itertools.repeat({n}, 2))",
                    f"(lambda miss: {n} if G_CACHE.get('w', miss) is miss else {n} * 2)(object())",
                    f"sum(map(torch.tanh, [{n}, {o.code}]))",
                    f"list(map(torch.sigmoid, ({n}, {o.code})))[1]",
                    f"[u * 2 for u in map(torch.abs, [{n}, {o.code}])][0]",
                ])
                return [f"{t} = {code}"]
        code, lo, hi = self.choice(ints)
        env[k] = V("int", lo=lo, hi=hi)
        return [f"{k} = {code}"]

    def st_dict(self, env, depth, loop):
        e = self.gen_t(env, 1)
        n = self.name("D")
        lines = [f"{n} = {{'a': {e.code}}}" if self.p(0.7) else f"{n} = dict(a={e.code})"]
        v = V("tdict", e.shape, keys={"a"})
        env[n] = v
        for _ in range(self.r.randint(0, 2)):
            o = self.gen_t_exact(env, v.shape, 1)
            if o is None:
                break
            k = self.choice(["b", "c", "a"])
            lines.append(f"{n}[{k!r}] = {o.code}")
            v.keys.add(k)
        if self.p(0.3):
            lines.append(f"{n}.update({{'u': {n}['a'] * 2}})")
            v.keys.add("u")
        return lines

    def st_tuple(self, env, depth, loop):
        a = self.gen_t(env, 1)
        g = self.r.randrange(3)
        if g == 0:
            b = self.gen_t(env, 1)
            n1, n2 = self.name("t"), self.name("t")
            env[n1] = V("t", a.shape, a.fresh)
            env[n2] = V("t", b.shape, b.fresh)
            return [f"{n1}, {n2} = {a.code}, {b.code}"]
        if g == 1:
            n = self.name("P")
            code, lo, hi = self.gen_int(env)
            env[n] = V("tup", items=[("t", a.shape), ("int", None)])
            return [f"{n} = ({a.code}, {code})"]
        # unpack a tensor (iterating over dim 0) when its first dim is a small int
        if a.shape and isinstance(a.shape[0], int) and 2 <= a.shape[0] <= 3:
            names = [self.name("r") for _ in range(a.shape[0])]
            for m in names:
                env[m] = V("t", a.shape[1:], False)
            return [f"{', '.join(names)} = {a.code}" if self.p(0.5)
                    else f"{', '.join(names)} = {a.code}.unbind(0)"]
        if len(a.shape) >= 1 and isinstance(a.shape[-1], int) and a.shape[-1] >= 2:
            n1, n2 = self.name("t"), self.name("t")
            k = a.shape[-1] // 2
            env[n1] = V("t", a.shape[:-1] + (k,), False)
            env[n2] = V("t", a.shape[:-1] + (a.shape[-1] - k,), False)
            return [f"{n1}, {n2} = {a.code}.split([{k}, {a.shape[-1] - k}], dim=-1)"]
        n = self.name("t")
        env[n] = V("t", a.shape, a.fresh)
        return [f"{n} = {a.code}"]

    def st_closure(self, env, depth, loop):
        g = self.r.randrange(6)
        n = self.name("f")
        if g == 0:
            k = self.gen_scalar_operand(env)
            body = self.choice(["t * {k} + 1", "torch.tanh(t) * {k}", "t.relu() - {k}",
                                "t * t + {k}"]).format(k=k)
            env[n] = V("fn", None)
            return [f"{n} = lambda t: {body}"]
        if g == 1:
            # an inner function capturing a tensor and a scalar of the enclosing call
            cap = self.leaf(env, lambda s: len(s) >= 1)
            k = self.gen_scalar_operand(env)
            cname = self.name("c")
            env_c = V("t", cap.shape, False)
            env[cname] = env_c
            env[n] = V("fn", cap.shape)
            return [f"{cname} = {cap.code}",
                    f"def {n}(t):",
                    f"    return t * {k} + {cname}"]
        if g == 2:
            # a nonlocal counter
            cn = self.name("cnt")
            env[n] = V("fn", None)
            return [f"{cn} = 0",
                    f"def {n}(t):",
                    f"    nonlocal {cn}",
                    f"    {cn} += 1",
                    f"    return t * {cn}"]
        if g == 3:
            # a closure over a function parameter, with a default
            return [f"def {n}(t, scale={self.fconst()}):",
                    f"    return HELPER(t, scale) + {self.fconst()}"] + \
                self._reg(env, n, V("fn", None))
        if g == 5:
            # a functools.partial made in the call, sometimes of a partial (flattened)
            k = self.gen_scalar_operand(env)
            env[n] = V("fn", None)
            return [self.choice([
                f"{n} = functools.partial(helper_kw, scale={k})",
                f"{n} = functools.partial(helper_kw, shift={k}, scale=2.0)",
                f"{n} = functools.partial(functools.partial(helper_kw, scale={k}), shift=1.0)",
                f"{n} = functools.partial(torch.clamp, min=-1.0, max={self.fconst()} + 1.0)"])]
        # lambdas made in a loop capture the loop variable late
        fs = self.name("FS")
        q = self.name("q")
        env[n] = V("fn", None)
        return [f"{fs} = []",
                f"for {q} in range({self.small_int(env, 3)}):",
                f"    {fs}.append(lambda t, {q}={q}: t + {q})" if self.p(0.5)
                else f"    {fs}.append(lambda t: t + {q})",
                f"def {n}(t):",
                f"    for g in {fs}:",
                "        t = g(t)",
                "    return t"]

    def _reg(self, env, n, v):
        env[n] = v
        return []

    def st_comprehension(self, env, depth, loop):
        g = self.r.randrange(5)
        n = self.name("C")
        lists = [(m, v) for m, v in env.items() if v.kind == "tlist"]
        dicts = [(m, v) for m, v in env.items() if v.kind == "tdict"]
        if g == 0 and lists:
            m, v = self.choice(lists)
            body = self.choice(["u * 2", "u.relu()", "u + i", "u * i"])
            if "i" in body:
                code = f"[{body} for i, u in enumerate({m})]"
            else:
                code = f"[{body} for u in {m}]"
            env[n] = V("tlist", v.shape, min_len=v.min_len)
            return [f"{n} = {code}"]
        if g == 1 and dicts:
            m, v = self.choice(dicts)
            env[n] = V("tdict", v.shape, keys=v.keys)
            return [f"{n} = {{k: u * 2 for k, u in {m}.items()}}"]
        if g == 2 and lists:
            m, v = self.choice(lists)
            if v.min_len >= 1:
                env[n] = V("t", (), True)
                if self.p(0.5):
                    return [f"{n} = sum(map(lambda u: u.sum(), {m}))"]
                return [f"{n} = sum([u.sum() for u in {m}])"]
        if g == 3:
            e = self.leaf(env, lambda s: len(s) >= 1 and self.dmin(s[0]) >= 2)
            if e is not None:
                bound = self.small_int(env, 2)
                env[n] = V("tlist", e.shape[1:], min_len=0)
                return [f"{n} = [{e.code}[j] * j for j in range({bound})]"]
        e = self.gen_t(env, 1)
        env[n] = V("tdict", e.shape, keys={"p", "q"})
        return [f"{n} = {{key: {e.code} * w for key, w in (('p', 1.0), ('q', 2.0))}}"]

    def st_if(self, env, depth, loop):
        cond, th, el = self.gen_cond(env)
        lines = [f"if {cond}:"]
        tenv = self.child_env(env, th)
        body = self.gen_block(tenv, self.r.randint(1, 3), depth + 1, loop)
        if self.p(0.15):
            body.append(f"return {self.gen_ret(tenv)}")
            self.features.add("early_return")
        self._merge_back(env, tenv)
        lines += indent(body)
        if self.p(0.5):
            eenv = self.child_env(env, el)
            lines.append("else:")
            lines += indent(self.gen_block(eenv, self.r.randint(1, 2), depth + 1, loop))
            self._merge_back(env, eenv)
        return lines

    def _merge_back(self, env, child):
        """After a block: variables of the outer scope keep their kind; a tensor reassigned in
        the block keeps its shape (guaranteed by the generator) but may no longer be fresh;
        lists and dicts keep the weaker of the facts."""
        for n, v in env.items():
            c = child.get(n)
            if c is None or c.kind != v.kind:
                continue
            if v.kind == "t":
                v.fresh = v.fresh and c.fresh
            elif v.kind == "tlist":
                v.min_len = min(v.min_len, c.min_len)
            elif v.kind == "tdict":
                v.keys = v.keys & c.keys

    def loop_body(self, env, depth, iterated=()):
        self.iterating += list(iterated)
        try:
            return self.gen_block(env, self.r.randint(1, 3), depth + 1, loop=True)
        finally:
            del self.iterating[len(self.iterating) - len(iterated):]

    def st_for_range(self, env, depth, loop):
        i = self.name("i")
        form = self.r.randrange(4)
        bound = self.small_int(env, 3)
        if form == 0:
            head = f"for {i} in range({bound}):"
            lo, hi = 0, 2
        elif form == 1:
            head = f"for {i} in range(1, {bound} + 1):"
            lo, hi = 1, 3
        elif form == 2:
            head = f"for {i} in reversed(range({bound})):"
            lo, hi = 0, 2
        else:
            head = f"for {i} in range(0, {bound} * 2, 2):"
            lo, hi = 0, 4
        benv = self.child_env(env, {i: V("int", lo=lo, hi=hi)})
        body = self.loop_body(benv, depth)
        self._merge_back(env, benv)
        return [head] + indent(body)

    def st_for_list(self, env, depth, loop):
        lists = [(m, v) for m, v in env.items() if v.kind == "tlist"]
        u = self.name("u")
        iterated = []
        if not lists or self.p(0.2):
            a = self.gen_t(env, 0)
            b = self.gen_t_exact(env, a.shape, 1) or a
            src, shape = f"[{a.code}, {b.code}]" if self.p(0.5) else f"({a.code}, {b.code})", \
                a.shape
        else:
            m, v = self.choice(lists)
            src, shape = m, v.shape
            iterated = [m]
            if self.p(0.2):
                src = f"reversed({m})"
        if self.p(0.4):
            j = self.name("j")
            head = f"for {j}, {u} in enumerate({src}):" if self.p(0.7) else \
                f"for {j}, {u} in enumerate({src}, 1):"
            benv = self.child_env(env, {u: V("t", shape, False), j: V("int", lo=0, hi=6)})
        else:
            head = f"for {u} in {src}:"
            benv = self.child_env(env, {u: V("t", shape, False)})
        body = self.loop_body(benv, depth, iterated)
        self._merge_back(env, benv)
        return [head] + indent(body)

    def st_for_zip(self, env, depth, loop):
        lists = [(m, v) for m, v in env.items() if v.kind == "tlist"]
        a, b = self.name("u"), self.name("u")
        iterated = [m for m, _ in lists]
        if lists and self.p(0.6):
            m, v = self.choice(lists)
            other_l = [(m2, v2) for m2, v2 in lists if m2 != m]
            if other_l and self.p(0.5):
                m2, v2 = self.choice(other_l)
                head = f"for {a}, {b} in zip({m}, {m2}):"
                upd = {a: V("t", v.shape, False), b: V("t", v2.shape, False)}
            else:
                head = f"for {a}, {b} in zip(range({self.small_int(env, 3)}), {m}):"
                upd = {a: V("int", lo=0, hi=3), b: V("t", v.shape, False)}
        else:
            e = self.leaf(env, lambda s: len(s) >= 1)
            head = f"for {a}, {b} in zip(range(3), {e.code}):"
            upd = {a: V("int", lo=0, hi=2), b: V("t", e.shape[1:], False)}
        benv = self.child_env(env, upd)
        body = self.loop_body(benv, depth, iterated)
        self._merge_back(env, benv)
        return [head] + indent(body)

    def st_for_dict(self, env, depth, loop):
        dicts = [(m, v) for m, v in env.items() if v.kind == "tdict"]
        if not dicts:
            return self.st_dict(env, depth, loop)
        m, v = self.choice(dicts)
        k, u = self.name("key"), self.name("u")
        g = self.r.randrange(4)
        if g == 0:
            head = f"for {k}, {u} in {m}.items():"
            upd = {u: V("t", v.shape, False)}
            pre = []
        elif g == 1:
            src = self.choice([m, m, f"sorted({m}, reverse=True)"])
            head = f"for {k} in {src}:"
            upd = {u: V("t", v.shape, False)}
            pre = [f"{u} = {m}[{k}]"]
        elif g == 2:
            head = f"for {u} in {m}.values():"
            upd = {u: V("t", v.shape, False)}
            pre = []
        else:
            head = f"for {k}, {u} in sorted({m}.items()):"
            upd = {u: V("t", v.shape, False)}
            pre = []
        benv = self.child_env(env, upd)
        body = pre + self.loop_body(benv, depth, [m])
        self._merge_back(env, benv)
        return [head] + indent(body)

    def st_while(self, env, depth, loop):
        w = self.name("w")
        bound = self.small_int(env, 3)
        benv = self.child_env(env, {w: V("int", lo=1, hi=4)})
        body = self.loop_body(benv, depth)
        self._merge_back(env, benv)
        if self.p(0.5):
            return [f"{w} = 0", f"while {w} < {bound}:", f"    {w} += 1"] + indent(body)
        return [f"{w} = 0", "while True:", f"    {w} += 1",
                f"    if {w} > {bound}:", "        break"] + indent(body)

    def st_break_continue(self, env, depth, loop):
        cond, _, _ = self.gen_cond(env)
        return [f"if {cond}:", f"    {self.choice(['break', 'continue'])}"]

    def st_raise(self, env, depth, loop):
        code, lo, hi = self.gen_int(env)
        a = min(max(lo, 0), 4)
        k = self.r.randint(a, max(a, min(hi, 4)) + 1)
        exc = self.choice(["ValueError", "RuntimeError", "KeyError"])
        return [f"if {code} > {k}:", f"    raise {exc}('fuzz: too big')"]

    def st_assert(self, env, depth, loop):
        ts = self.tensors(env, lambda s: len(s) >= 1)
        if not ts:
            return ["assert G_INT >= -100"]
        n, v = self.choice(ts)
        d = v.shape[-1]
        if isinstance(d, int):
            return [f"assert {n}.shape[-1] == {d}, 'shape'"]
        return [f"assert {n}.dim() == {len(v.shape)}"]

    def st_data_check(self, env, depth, loop):
        # a check of tensor data whose failing side raises ([Note: branches to a raise]): a
        # replay check while nothing visible has happened, a break after; some calls fail it
        ts = self.tensors(env, lambda s: True)
        if not ts:
            return ["assert G_INT >= -100"]
        n, _ = self.choice(ts)
        k = self.choice(["2.0", "2.5", "3.0", "1e3"])
        exc = self.choice(["ValueError", "RuntimeError"])
        return self.choice([
            [f"assert ({n}.abs() < {k}).all(), 'fuzz: large values'"],
            [f"if torch.isnan({n}).any():", f"    raise {exc}('fuzz: NaN')"],
            [f"if not ({n} < {k}).all():", f"    raise {exc}('fuzz: over {k} in %s' % (tuple({n}.shape),))"],
            [f"if {n}.sum().item() > {k} * {n}.numel():", f"    raise {exc}('fuzz: mean too big')"],
        ])

    def st_pair(self, env, depth, loop):
        # an instance of a user class made inside the function
        a = self.gen_t(env, 1)
        k = self.gen_int(env)[0]
        n = self.name("p")
        t = self.name("t")
        env[t] = V("t", a.shape, True)
        g = self.r.randrange(5)
        if g == 4:  # called: its class's __call__
            return [f"{n} = Pair({a.code}, {k})", f"{t} = {n}({a.code}) + {n}.first"]
        if g == 3:  # a subclass whose __init__ and method call super()
            return [f"{n} = Triple({a.code}, {k}, {self.gen_int(env)[0]})",
                    f"{t} = {n}.first * {n}.total() + {n}.third"]
        if g == 1:  # attributes written after it was made, and a new one
            return [f"{n} = Pair({a.code}, {k})", f"{n}.second = {n}.second + 1",
                    f"{n}.third = {n}.first * 2",
                    f"{t} = {n}.third + {n}.first * {n}.second"]
        if g == 2:  # made in a comprehension, read through map
            lists = [(m, v) for m, v in env.items() if v.kind == "tlist" and v.shape == a.shape]
            if lists:
                m, _ = self.choice(lists)
                return [f"{n} = [Pair(u, {k}) for u in {m}]",
                        f"{t} = sum(map(Pair.total, {n}), {a.code})"]
        return [f"{n} = Pair({a.code}, {k})",
                f"{t} = {n}.first * {n}.second + {n}.total()"]

    def st_breaker(self, env, depth, loop):
        """Constructs the engine documents as graph breaks (the call runs eagerly)."""
        e = self.leaf(env)
        n = self.name("t")
        g = self.r.randrange(11)
        self.features.add("breaker")
        k = self.gen_scalar_operand(env)  # (before `n` is in scope)
        env[n] = V("t", e.shape, True)
        if g == 6:
            # the break is inside an inlined callee
            return [f"{n} = helper_item({e.code}, {k})"]
        if g == 7:
            return [f"{n} = helper_branch({e.code})"]
        if g == 8:
            # a Python value from tensor data flows into later control flow
            k = self.name("k")
            env[k] = V("int", lo=0, hi=3)
            return [f"{k} = int({e.code}.numel() > 0 and {e.code}.abs().sum() > 1.0) + 1",
                    f"{n} = {e.code} * {k}"]
        if g == 9:
            # side effects on both sides of the break
            return [f"G_LOG.append({e.code}.sum())", f"{n} = {e.code} * {e.code}.mean().item()",
                    f"G_LOG.append({n}.sum())"]
        if g == 10:
            return [f"print({e.code}.shape, file=_SINK)", f"{n} = {e.code} + 1"]
        if g == 0:
            return [f"{n} = {e.code} * float({e.code}.sum())"]
        if g == 1:
            return [f"if {e.code}.sum() > 0:", f"    {n} = {e.code} * 2", "else:",
                    f"    {n} = {e.code} - 1"]
        if g == 2:
            return ["with torch.no_grad():", f"    {n} = {e.code} * 3"]
        if g == 3:
            return ["try:", f"    {n} = {e.code}.view(-1, 7)", "except RuntimeError:",
                    f"    {n} = {e.code} + 1"]
        if g == 4:
            return [f"{n} = {e.code} * sum(i for i in range(3))"]
        return [f"{n} = {e.code} * {e.code}.abs().max().item()"]

    # ------------------------------------------------------------------ return
    def gen_ret(self, env):
        ts = self.tensors(env)
        if not ts:
            return "None"

        def tcode():
            n, v = self.choice(ts)
            return n
        g = self.wchoice([(6, "t"), (3, "tuple"), (1, "list"), (1, "dict"), (1, "none"),
                          (1, "container"), (1, "scalar"), (1, "obj")])
        if g == "t":
            if self.p(0.3):
                return self.gen_t(env, 1).code
            return tcode()
        if g == "tuple":
            parts = [tcode() for _ in range(self.r.randint(1, 3))]
            if self.p(0.5):
                parts.append(self.gen_int(env)[0])
            if self.p(0.2):
                parts.append(f"{self.choice(ts)[0]}.shape")
            return "(" + ", ".join(parts) + ",)" if len(parts) == 1 else ", ".join(parts)
        if g == "list":
            return "[" + ", ".join(tcode() for _ in range(self.r.randint(1, 3))) + "]"
        if g == "dict":
            return "{" + ", ".join(f"'o{i}': {tcode()}"
                                   for i in range(self.r.randint(1, 3))) + ", 'n': " + \
                self.gen_int(env)[0] + "}"
        if g == "none":
            return "None"
        if g == "scalar":
            return f"{self.gen_float(env)}, {self.gen_int(env)[0]}"
        if g == "obj":
            objs = [n for n, v in env.items() if v.kind == "obj"]
            return f"{self.choice(objs)}, {tcode()}" if objs else tcode()
        cs = [n for n, v in env.items() if v.kind in ("tlist", "tdict")] + ["G_LOG", "G_CACHE"]
        if cs:
            return self.choice(cs)
        return tcode()

    def final_ret(self, env):
        """The last return: usually many of the values computed, so that a wrong one shows."""
        if self.p(0.3):
            return self.gen_ret(env)
        names = [n for n, v in env.items()
                 if v.kind in ("t", "int", "float", "tlist", "tdict", "tup") and n not in PARAMS]
        picked = names[-self.r.randint(2, 6):]
        extra = [n for n in names if n not in picked]
        self.r.shuffle(extra)
        picked += extra[:self.r.randint(0, 2)]
        if not picked:
            return self.gen_ret(env)
        if self.p(0.2):
            return "{" + ", ".join(f"{n!r}: {n}" for n in picked) + "}"
        return ", ".join(picked) + ("," if len(picked) == 1 else "")

    # ------------------------------------------------------------------ the module
    def generate(self):
        r, F, H = self.r, self.F, self.H
        nc = self.n_calls
        # parameters of fn
        params = ["x"]
        use = {k: self.p(pr) for k, pr in
               [("y", 0.6), ("n", 0.6), ("lst", 0.5), ("d", 0.35), ("obj", 0.45),
                ("flag", 0.5), ("s", 0.35), ("opt", 0.4), ("m", 0.15), ("idx", 0.15)]}
        y_shape = self.choice([("B", F), ("B", F), (F,)])
        env = {"x": V("t", ("B", F), False)}
        if use["y"]:
            params.append("y")
            env["y"] = V("t", y_shape, False)
        if use["n"]:
            params.append("n")
            env["n"] = V("int", lo=0, hi=4)
        lst_persistent = self.p(0.5)
        if use["lst"]:
            params.append("lst")
            env["lst"] = V("tlist", (F,), min_len=1, ext=True)
        dct_persistent = self.p(0.5)
        if use["d"]:
            params.append("d")
            env["d"] = V("tdict", (F,), keys={"a"}, ext=True)
        obj_persistent = self.p(0.6)
        if use["obj"]:
            params.append("obj")
            env["obj"] = V("obj", ext=True)
        if use["m"]:
            params.append("m")
            env["m"] = V("mod")
        if use["idx"]:
            params.append("idx")
            env["idx"] = V("idx")
        defaults = []
        if use["flag"]:
            defaults.append(("flag", "True"))
            env["flag"] = V("bool")
        if use["s"]:
            defaults.append(("s", "0.5"))
            env["s"] = V("float")
        if use["opt"]:
            defaults.append(("opt", "None"))
            env["opt"] = V("opt", (F,))
        kwonly = self.p(0.15)

        # the body
        body = self.gen_block(env, r.randint(3, 9), 0)
        body.append(f"return {self.final_ret(env)}")
        sig = ", ".join(params + [f"{k}={v}" for k, v in defaults[:1 if kwonly else None]])
        if kwonly and len(defaults) > 1:
            sig += ", *, " + ", ".join(f"{k}={v}" for k, v in defaults[1:])
        fn_lines = [f"def fn({sig}):"]
        if self.global_writes:
            fn_lines.append(f"    global {', '.join(sorted(self.global_writes))}")
        fn_lines += indent(body)

        # per-call argument values
        sticky = r.choice([0.1, 0.2, 0.35])

        def seq(choices):
            # mostly repeating values (so later calls replay), changing now and then
            out = [self.choice(choices)]
            for _ in range(nc - 1):
                out.append(self.choice(choices) if self.p(sticky) else out[-1])
            return out
        batch_seq = seq([2, 3, 4])
        n_seq = seq([0, 1, 2, 3, 4])
        if self.p(0.15):
            # values equal under == but of other types (guards must tell them apart)
            n_seq = seq([1, True, 1.0, 0, False, 2])
        flag_seq = seq([True, False])
        if self.p(0.1):
            flag_seq = seq([True, 1, False, 0, None])
        s_seq = seq([0.25, 0.5, 2.0])
        if self.p(0.2):
            s_seq = seq([0.0, -0.0, 0.5, 1, float("inf")])
        # x: 0 plain, 1 transposed (non-contiguous), 2 with a storage offset,
        # 3 requires_grad, 4 float64
        x_seq = [0] * nc if self.p(0.6) else seq([0, 0, 1, 2, 3, 4])
        idx_seq = seq([[0, 1], [1, 0], [1, 1]])
        if self.p(0.5):
            idx_seq[r.randrange(nc)] = [0, 7]
        opt_seq = seq([True, False])
        len_seq = seq([1, 2, 3])
        alias_seq = seq([False, False, True]) if y_shape == ("B", F) else [False] * nc
        # how the defaulted parameters are passed: 0 omitted, 1 keyword, 2 positional
        kw_seq = seq([[r.choice([0, 1, 1, 2]) for _ in defaults] for _ in range(3)])
        # calls made inside `torch.autocast("cpu", dtype=torch.bfloat16)` by the runner: the
        # same ops give other dtypes, which the guards must notice
        autocast_seq = seq([False, True]) if self.p(0.1) else [False] * nc

        mk = ["def make_args(i):",
              "    x = _make_x(X_SEQ[i])"]
        args = ["x"]
        if use["y"]:
            ys = "torch.randn(BATCH, F)" if y_shape == ("B", F) else "torch.randn(F)"
            mk.append(f"    y = x if ALIAS_SEQ[i] else {ys}")
            args.append("y")
        if use["n"]:
            args.append("N_SEQ[i]")
        if use["lst"]:
            if lst_persistent:
                args.append("LST")
            else:
                mk.append("    lst = [torch.randn(F) for _ in range(LEN_SEQ[i])]")
                args.append("lst")
        if use["d"]:
            if dct_persistent:
                args.append("DCT")
            else:
                mk.append("    d = {'a': torch.randn(F)}")
                mk.append("    if i % 2:")
                mk.append("        d['b'] = torch.randn(F)")
                args.append("d")
        if use["obj"]:
            if obj_persistent:
                args.append("OBJ")
            else:
                mk.append("    o = Obj()")
                mk.append("    o.scale = S_SEQ[i] * 2")
                mk.append(f"    o.flag = FLAG_SEQ[(i + 1) % {nc}]")
                args.append("o")
        if use["m"]:
            args.append("NET")
        if use["idx"]:
            args.append("torch.tensor(IDX_SEQ[i])")
        mk.append("    args = [" + ", ".join(args) + "]")
        mk.append("    kwargs = {}")
        vals = {"flag": "FLAG_SEQ[i]", "s": "S_SEQ[i]",
                "opt": "(torch.randn(F) if OPT_SEQ[i] else None)"}
        if defaults:
            mk.append("    positional = True")
        for j, (k, _) in enumerate(defaults):
            mk.append(f"    mode = KW_SEQ[i][{j}]")
            if kwonly and j >= 1:
                mk.append("    if mode:")
                mk.append(f"        kwargs[{k!r}] = {vals[k]}")
            else:
                mk.append("    if mode == 2 and positional:")
                mk.append(f"        args.append({vals[k]})")
                mk.append("    elif mode:")
                mk.append(f"        kwargs[{k!r}] = {vals[k]}")
                mk.append("        positional = False")
                mk.append("    else:")
                mk.append("        positional = False")
        mk.append("    return args, kwargs")

        # mutations between calls
        mut = ["def mutate(i):",
               "    global BATCH, G_INT, G_FLOAT, G_FLAG, G_OPT, G_T, G_B, HELPER, G_OUT, G_NP, "
               "G_SCOPE"]
        flip_defaults = []
        if defaults and not kwonly:
            flip_defaults = ["fn.__defaults__ = _flip_all(fn.__defaults__)"]
        elif defaults:
            flip_defaults = ["fn.__kwdefaults__ = {k: _flip(v) for k, v in "
                             "fn.__kwdefaults__.items()}"]
        rare = [
            # changes the engine must notice through its guards
            "G_T.add_(1.0)", "W0.mul_(-1.0)", "OBJ.buf.zero_()", "LST[0].add_(1.0)",
            "DCT['a'].mul_(2.0)", "G_T = torch.randn(F * 2)[::2]",
            f"BATCH = {r.choice([2, 3, 4])}\n"
            "    G_B.resize_(BATCH, F).copy_(torch.randn(BATCH, F))",
            "torch.set_grad_enabled(False)", "torch.set_grad_enabled(True)",
            "_hooks.append(NET.fc.register_forward_hook(_hook_double))",
            "_hooks.append(NET.register_forward_pre_hook(_pre_hook))",
            "if _hooks:\n        _hooks.pop().remove()",
            "NET.act = nn.Tanh()", "NET.layers.append(nn.Linear(H, H))",
            "if builtins.len(NET.layers) > 1:\n        del NET.layers[-1]",
            "NET.fc.weight.requires_grad_(not NET.fc.weight.requires_grad)",
            "helper_kw.__kwdefaults__ = {'shift': -1.5}", "helper_kw.__defaults__ = (3.0,)",
            "SCALER.__closure__[0].cell_contents = SCALER.__closure__[0].cell_contents + 1.0",
            "Obj.apply = _alt_apply", "OBJ.apply = _inst_apply",
            "globals()['abs'] = _my_abs", "globals()['min'] = _my_min",
            "globals()['len'] = _my_len",
            "LST.append(torch.randn(F + 1))",
            "G_OUT['aux'] = torch.randn(F)", "G_OUT = Result(main=torch.randn(F))",
            "G_OUT.main = torch.randn(F)",
            "G_NP = G_NP.astype(np.float32)", "G_NP = np.linspace(0.0, 2.0, 2 * F)[::2]",
            "G_NP[0] = 5.0", "G_NP = np.arange(F)",
            "G_SCOPE.tag = G_SCOPE.tag + 1", "G_SCOPE = Scope(G_LOG, 0)",
        ] + flip_defaults
        for i in range(1, nc):
            acts = []
            if batch_seq[i] != batch_seq[i - 1] and self.p(0.5):
                acts += [f"BATCH = {batch_seq[i]}",
                         "G_B.resize_(BATCH, F).copy_(torch.randn(BATCH, F))"]
            elif batch_seq[i] != batch_seq[i - 1]:
                acts += [f"BATCH = {batch_seq[i]}", "G_B = torch.randn(BATCH, F)"]
            for _ in range(r.choice([0, 0, 1, 1, 2])):
                if self.p(0.3):
                    acts.append(self.choice(rare))
                    continue
                acts.append(self.choice([
                    f"G_INT = {r.randint(0, 4)}", "G_INT += 1",
                    f"G_FLOAT = {self.choice(['0.25', '0.5', '0.75'])}",
                    "G_FLAG = not G_FLAG",
                    "G_OPT = None if G_OPT is not None else torch.randn(F)",
                    "G_T = torch.randn(F)", "G_T = torch.randn(F)[None].expand(2, F)[0]",
                    "LST.append(torch.randn(F))",
                    "if builtins.len(LST) > 1:\n        LST.pop()",
                    "LST[0] = torch.randn(F)",
                    "OBJ.scale = OBJ.scale + 0.5", "OBJ.flag = not OBJ.flag",
                    "OBJ.count += 1", "OBJ.buf = torch.randn(F)",
                    "OBJ.history.clear()",
                    "Obj.factor = Obj.factor + 1.0",
                    "NET.use_act = not NET.use_act", "NET.train(not NET.training)",
                    "NET.calls = 0",
                    "with torch.no_grad():\n        NET.fc.weight.mul_(0.5)",
                    "DCT['b'] = torch.randn(F)", "DCT.pop('b', None)", "DCT['a'] = torch.randn(F)",
                    "G_LOG.clear()", "G_CACHE.clear()",
                    "_LOG.setLevel(logging.ERROR if _LOG.level == logging.INFO "
                    "else logging.INFO)",
                    "HELPER = helper_b if HELPER is helper_a else helper_a",
                    f"BATCH = {r.choice([2, 3, 4])}\n    G_B = torch.randn(BATCH, F)",
                ]))
            if acts:
                mut.append(f"    if i == {i}:")
                for a in acts:
                    mut.append("        " + a.replace("\n    ", "\n        "))
        mut.append("    return None")

        net_break = ""
        if self.p(self.break_rate * 2):
            net_break = self.choice(["\n        y = y * float(y.mean() > 0)",
                                     "\n        if y.sum() > 0:\n            y = y + 1",
                                     "\n        self.calls += 1"
                                     "\n        y = y * y.abs().max().item()"])
        header = f'''\
# magpy fuzz program, seed {self.seed}
import builtins
import collections
import contextlib
import copy
import dataclasses
import functools
import io
import itertools
import logging
import operator
import warnings

import numpy as np
import torch
import torch.nn as nn

F = {F}
H = {H}
BATCH = {batch_seq[0]}
G_INT = {r.randint(0, 3)}
G_FLOAT = {self.choice(['0.25', '0.5', '0.75'])}
G_FLAG = {self.choice(['True', 'False'])}
G_OPT = {self.choice(['None', 'torch.randn(F)'])}
G_T = torch.randn(F)
G_B = torch.randn(BATCH, F)
W0 = torch.randn(F, H)
W1 = torch.randn(H, F)
G_LOG = []
G_RECORDS = []
G_CACHE = {{}}
WARN_MODE = {self.choice(['"always"', '"default"'])}
N_SEQ = {n_seq!r}
X_SEQ = {x_seq!r}
IDX_SEQ = {idx_seq!r}
FLAG_SEQ = {flag_seq!r}
S_SEQ = [{", ".join('float("inf")' if v == float("inf") else repr(v) for v in s_seq)}]
OPT_SEQ = {opt_seq!r}
LEN_SEQ = {len_seq!r}
ALIAS_SEQ = {alias_seq!r}
KW_SEQ = {kw_seq!r}
AUTOCAST_SEQ = {autocast_seq!r}


class Obj:
    factor = 1.0

    def __init__(self):
        self.scale = {self.choice(['0.5', '1.5', '2.0'])}
        self.count = {r.randint(0, 2)}
        self.flag = {self.choice(['True', 'False'])}
        self.buf = torch.randn(F)
        self.history = []

    def apply(self, t):
        return t * self.scale * self.factor + self.count

    def __str__(self):
        return f"Obj(count={{self.count}}, flag={{self.flag}})"

    def mix(self, t):
        return t + self.buf * self.scale

    def bump(self):
        self.count += 1
        return self.count

    @property
    def doubled(self):
        return self.scale * 2

    @property
    def level(self):
        return self.count

    @level.setter
    def level(self, v):
        self.count = v


class Stats:
    def __init__(self, t):
        self.t = t

    @functools.cached_property
    def total(self):
        return self.t.sum() * 0.5


class Out(collections.OrderedDict):
    """transformers' ModelOutput: fields that are not None are also items."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is not None:
                self[f.name] = getattr(self, f.name)

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return tuple(self[n] for n in self.keys())[k]

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)


@dataclasses.dataclass
class Result(Out):
    main: torch.Tensor = None
    aux: torch.Tensor = None


@contextlib.contextmanager
def logged(log, name):
    log.append(("enter", name))
    yield name.upper()
    log.append(("exit", name))


@contextlib.contextmanager
def maybe_no_grad(flag):
    if flag:
        with torch.no_grad():
            yield
    else:
        yield


class Scope:
    """A context manager class of the program's own: logs, counts its depth, and changes OBJ
    for the block, putting it back after (also when the block raises)."""

    def __init__(self, log, tag):
        self.log = log
        self.tag = tag
        self.depth = 0

    def __enter__(self):
        self.depth += 1
        self.saved = OBJ.scale
        OBJ.scale = OBJ.scale + self.tag
        self.log.append(("in", self.tag, self.depth))
        return self.tag * 2

    def __exit__(self, kind, value, tb):
        OBJ.scale = self.saved
        self.depth -= 1
        self.log.append(("out", self.tag, None if kind is None else kind.__name__))


class Slots2:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


class Bag(dict):
    def total(self):
        return sum(v for k, v in self.items() if k != "n")


class Tracked:
    def __init__(self, t):
        object.__setattr__(self, "names", [])
        self.t = t

    def __setattr__(self, name, value):
        self.names.append(name)
        object.__setattr__(self, name, value)


class Pair:
    def __init__(self, first, second):
        self.first = first
        self.second = second

    def total(self):
        return self.second + 1

    def __call__(self, t):
        return t * self.second + self.first


class Triple(Pair):
    def __init__(self, first, second, third):
        super().__init__(first, second)
        self.third = third

    def total(self):
        return super().total() + self.third


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(F, H)
        self.act = nn.ReLU()
        self.layers = nn.ModuleList([nn.Linear(H, H) for _ in range({r.randint(1, 3)})])
        self.use_act = {self.choice(['True', 'False'])}
        self.calls = 0
        self.drop = nn.Dropout({self.choice(['0.0', '0.5']) if self.p(0.3) else '0.0'})

    def forward(self, x):
        y = self.fc(x)
        if self.use_act:
            y = self.act(y)
        y = self.drop(y)
        for layer in self.layers:
            y = layer(y) + y{' * 0.5' if self.p(0.5) else ''}
        if not self.training:
            y = y * 2{net_break}
        return y


class SubNet(Net):
    def forward(self, x):
        y = super().forward(x)
        return y * 0.5 + super(SubNet, self).forward(x).relu()


def helper_a(t, k):
    return t * k + 1


def helper_b(t, k):
    return torch.tanh(t) - k


def helper_kw(t, scale=2.0, *, shift=0.5):
    return t * scale + shift


def helper_item(t, k):
    u = t * k
    return u * u.sum().item() + t


def helper_branch(t):
    if t.sum() > 0:
        return t * 2
    return t - 1


def gen_scaled(t, k):
    for i in range(k):
        yield t * (i + 1)


def gen_logged(t, k):
    for i in range(k):
        G_LOG.append(i)
        yield t - i


def gen_from(t, k):
    yield t
    yield from gen_scaled(t, k)


def gen_printing(t, k):
    for i in range(k):
        print("gen", i, file=_SINK)
        yield t + i


def gen_bump(t, k):
    for _ in range(k):
        yield t * OBJ.bump()


def gen_item(t, k):
    for i in range(k):
        yield t * float(t.sum().item() > 0) + i


def helper_noisy(t, k):
    u = t * k
    print("noisy", u.shape, file=_SINK)
    return u[u > 0].view(-1, 2) + 1


def helper_rec(t, k):
    if k <= 0:
        return t
    return helper_rec(t * 0.5, k - 1) + k


def make_scaler(k):
    def scaler(t):
        return t * k
    return scaler


SCALER = make_scaler({self.fconst()})


def _make_x(mode):
    if mode == 1:
        return torch.randn(F, BATCH).t()
    if mode == 2:
        return torch.randn(BATCH + 1, F)[1:]
    if mode == 3:
        return torch.randn(BATCH, F, requires_grad=True)
    if mode == 4:
        return torch.randn(BATCH, F, dtype=torch.float64)
    return torch.randn(BATCH, F)


def _flip(v):
    if isinstance(v, bool):
        return not v
    if isinstance(v, float):
        return v * 4
    return v


def _flip_all(defaults):
    return tuple(_flip(v) for v in defaults)


def _alt_apply(self, t):
    return t * 3.0 - self.count


def _inst_apply(t):
    return t - 2.0


def _my_abs(v):
    return v * v


def _my_min(a, b):
    return max(0, a - 1) if a < b else b


def _my_len(v):
    return builtins.len(v) + 1


def _hook_double(module, inputs, output):
    return output * 2


def _pre_hook(module, inputs):
    return (inputs[0] * 0.5,)


class _Records(logging.Handler):
    def emit(self, record):
        G_RECORDS.append((record.levelname, record.funcName, record.lineno,
                          record.getMessage(), getattr(record, "tag", None)))


_LOG = logging.getLogger(__name__ + ".log")  # one per world
_LOG.handlers[:] = [_Records()]
_LOG.setLevel(logging.INFO)
_LOG.propagate = False
_hooks = []
_SINK = io.StringIO()
HELPER = {self.choice(['helper_a', 'helper_b'])}
OBJ = Obj()
G_OUT = Result(main=torch.randn(F), aux=torch.randn(F))
G_NP = np.linspace(-1.0, 1.0, F)
G_SCOPE = Scope(G_LOG, 2)
NET = {'SubNet' if self.p(0.3) else 'Net'}()
NET.train({self.choice(['True', 'False'])})
LST = [torch.randn(F) for _ in range({r.randint(1, 3)})]
DCT = {{'a': torch.randn(F){", 'b': torch.randn(F)" if self.p(0.5) else ''}}}
'''
        return "\n".join([header, "", *fn_lines, "", "", *mk, "", "", *mut, ""])


def generate(seed, n_calls=6):
    """The source of the program for `seed`."""
    return ProgramGen(seed, n_calls).generate()


def generate_with_info(seed, n_calls=6):
    g = ProgramGen(seed, n_calls)
    src = g.generate()
    return src, g.features


if __name__ == "__main__":
    import sys
    print(generate(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
