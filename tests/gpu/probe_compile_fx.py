"""Probe: torch.compile(gm) against inductor's compile_fx(gm, inputs) called directly (no
dynamo frame or guards), with and without inductor's CUDA graphs. Prints us per call."""
import inspect, time, torch
from torch._inductor.compile_fx import compile_fx
print("compile_fx", inspect.signature(compile_fx))
class M(torch.nn.Module):
    def forward(self, x):
        for _ in range(20):
            x = torch.sin(x) * 1.01 + 0.1
        return (x,)
gm = torch.fx.symbolic_trace(M()).cuda()
x = torch.randn(16, device="cuda")
ref = gm(x)[0]
def timed(name, make):
    t0 = time.perf_counter()
    try:
        f = make()
        try:
            out = f(x)
            conv = "args"
        except TypeError:
            out = f([x]); conv = "list"
            g = f; f = lambda a: g([a])
        t1 = time.perf_counter()
        for _ in range(10): f(x)
        torch.cuda.synchronize()
        n = 300; s = time.perf_counter()
        for _ in range(n): f(x)
        torch.cuda.synchronize()
        per = (time.perf_counter() - s) / n * 1e6
        o = out[0] if isinstance(out, (list, tuple)) else out
        print(f"{name:28} {per:8.1f} us/call compile {t1-t0:6.2f} s conv {conv} type {type(out).__name__} diff {(o-ref).abs().max().item():.1e}")
    except Exception as e:
        print(f"{name:28} failed: {type(e).__name__}: {str(e)[:300]}")
timed("compile_fx", lambda: compile_fx(gm, [x]))
timed("compile_fx+cudagraphs,no trees", lambda: compile_fx(gm, [x], config_patches={"triton.cudagraphs": True, "triton.cudagraph_trees": False}))
def backend_cg():
    from torch._dynamo.backends.cudagraphs import cudagraphs
    return cudagraphs(gm, [x])
timed("dynamo cudagraphs backend fn", backend_cg)
timed("torch.compile(gm, cudagraphs)", lambda: torch.compile(gm, backend="cudagraphs", fullgraph=True, dynamic=False))
