"""`%load_ext magpy` in IPython or ipykernel: the %%magpy cell magic (a first version; the
kernel issue brings live views)."""

import ast
import types

from IPython.core.magic import Magics, magics_class, cell_magic, line_magic
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring


@magics_class
class MagpyMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self._cells = {}     # cell source -> compiled function (so reruns hit the cache)
        self.last = None

    @magic_arguments()
    @argument("--backend", default="eager")
    @argument("--fullgraph", action="store_true")
    @argument("--quiet", action="store_true")
    @cell_magic
    def magpy(self, line, cell):
        """Run the cell under magpy: its code is captured, and a rerun replays the graph."""
        import magpy
        args = parse_argstring(self.magpy, line)
        key = (cell, args.backend, args.fullgraph)
        cf = self._cells.get(key)
        if cf is None:
            cf = magpy.compile(_cell_function(cell, self.shell.user_ns), backend=args.backend,
                               fullgraph=args.fullgraph)
            self._cells[key] = cf
        self.last = cf
        result = cf()
        if not args.quiet:
            print(magpy.explain(cf))
        return result

    @line_magic("magpy_explain")
    def magpy_explain(self, line):
        import magpy
        if self.last is None:
            print("no %%magpy cell has run yet")
            return None
        return magpy.explain(self.last)


def _cell_function(source, user_ns):
    """Wrap a cell into a function over the notebook's globals; the last expression is returned."""
    tree = ast.parse(source)
    body = tree.body or [ast.Pass()]
    if isinstance(body[-1], ast.Expr):
        body[-1] = ast.Return(value=body[-1].value)
    # Names the cell assigns stay notebook globals, as they would without %%magpy.
    assigned = sorted({t.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                       for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                       if isinstance(t, ast.Name)})
    if assigned:
        body.insert(0, ast.Global(names=assigned))
    fn = ast.FunctionDef(name="_magpy_cell", args=ast.arguments(posonlyargs=[], args=[], vararg=None,
                         kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
                         body=body, decorator_list=[], returns=None, type_comment=None)
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    code = compile(module, "<magpy cell>", "exec")
    exec(code, user_ns)
    return user_ns.pop("_magpy_cell")


def load(ipython):
    ipython.register_magics(MagpyMagics)
