"""The corpus entry format shared by every corpus file of the coverage benchmark.

A corpus file (`corpus_*.py` in this folder) defines `programs()`, which returns a list of
`Program`s. Building that list must be cheap: nothing is constructed until a program runs.

    Program(
        name="prog/my_block",          # unique; "group/name" by convention (--filter matches it)
        make=lambda: MyBlock(32),      # builds the callable: an nn.Module or a plain function
        inputs=lambda: (torch.randn(1, 16, 32),),   # the positional arguments of one call
    )

`make` runs after `torch.manual_seed(seed)`, so random weights are the same on every run; an
`nn.Module` it returns is put in eval mode (unless `train=True`). `inputs` runs once per call,
after `torch.manual_seed(seed + 1 + call_index)`; it returns a tuple of positional arguments, a
single argument (anything but a tuple), or `Args(*args, **kwargs)` for keyword arguments too.
The runner deep-copies what it returns, so the eager and the compiled call get identical,
fresh inputs (and in-place changes to them are compared as well). Before each eager call and
each compiled call the runner also sets the same seed, so programs that draw random numbers
(dropout in training mode, `torch.randn_like`) are comparable.
"""

from dataclasses import dataclass, field
from typing import Any, Callable, Optional


class Args:
    """Positional and keyword arguments of one call, for `Program.inputs`."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs

    def __repr__(self):
        return f"Args(*{self.args!r}, **{self.kwargs!r})"


@dataclass
class Program:
    name: str
    make: Callable[[], Callable]
    inputs: Callable[[], Any]
    # in the representative subset that `--quick` runs
    quick: bool = False
    # calls compared against eager (all with inputs of the same shapes: call 1 captures,
    # later calls should be cache hits)
    calls: int = 3
    seed: int = 0
    # leave an nn.Module in training mode instead of calling .eval()
    train: bool = False
    # build the callable twice (same seed): one for eager, one for magpy. Needed when the
    # program changes its own state (running stats, counters), so that the two runs do not
    # see each other's writes. Default: one object, called eagerly first, then compiled.
    separate_worlds: bool = False
    # tolerances for torch.allclose when results are not bit-for-bit equal
    rtol: float = 1e-4
    atol: float = 1e-5
    # seconds before the runner gives up on the program (subprocess mode only)
    timeout: float = 300.0
    # if set, the program is listed as skipped with this reason and not run
    skip: Optional[str] = None
    # if set, the program takes long (the reason says how long): it is listed as skipped
    # unless run.py gets --slow
    slow: Optional[str] = None
    # shown in the output next to the program (e.g. "input 16x224x224: the model needs it")
    note: str = ""
    tags: tuple = field(default_factory=tuple)

    @property
    def group(self):
        return self.name.split("/", 1)[0] if "/" in self.name else ""


def split_args(value):
    """(args, kwargs) from what `Program.inputs` returned."""
    if isinstance(value, Args):
        return tuple(value.args), dict(value.kwargs)
    if isinstance(value, tuple):
        return value, {}
    return (value,), {}
