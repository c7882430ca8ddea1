"""Rich views of a magpy report for notebooks: pure functions from a report dict to a mimebundle.

Each view is one display_data bundle with three representations:

    application/vnd.magpy.<kind>+json   the view's data (for the kernel.js / frontend renderers)
    text/html                           self-contained: inline CSS, no <script>, everything escaped
    text/plain                          a readable summary for terminals and plain frontends

Kinds: progress (the live view), graphs, refgraph, guards, breaks, plan, timings.

Every builder takes the engine's report (``json.loads(magpy.explain(cf).to_json())``, see
share/magpy-report.schema.json) and a context dict that says where the code came from:

    ctx = {
        "label": "Cell In[5]",            # how the user names the code
        "filename": "<ipython-input-5-..>",   # the filename the code was compiled with
        "source": "%%magpy\\ny = x * 2\\n",  # the text the line numbers refer to
        "file_labels": {filename: "Cell In[3]"},  # other notebook cells the report points at
        "file_lines": {filename: {lineno: "text"}},  # their lines, for breaks outside the cell
        "run": {...},                      # this run of the cell (see _ipython.run_summary)
    }

[SECTION] index: MIME and formatting helpers; replay plan parsing; graphs; refgraph (DOT and
graphviz); guards; breaks; plan; timings; progress; all views.
"""

import ast
import hashlib
import html
import os
import re
import shutil
import subprocess
from collections import OrderedDict

from ._explain import BREAK_REASONS

MIME_PREFIX = "application/vnd.magpy."
VIEW_SCHEMA_VERSION = 1
KINDS = ("graphs", "refgraph", "guards", "breaks", "plan", "timings")

# Graphviz: dot is fine for a few hundred nodes when network simplex is capped; above that the
# graph is collapsed first, and the layout is killed after DOT_TIMEOUT_S seconds whatever happens.
# See /work/shared/notes/style-gui-cupti.md section 4 for the measurements behind these numbers.
DOT_COMMAND = "dot"
DOT_TIMEOUT_S = 5.0
DOT_CAPS = ("-Gnslimit=1", "-Gnslimit1=1", "-Gmclimit=0.3")
MAX_DRAWN_NODES = 300
MAX_INPUTS_PER_COLLAPSED_GRAPH = 12
# Views are kept light enough for a notebook whatever the program (a review probe: a 3000-step
# loop wrote 4.6 MB of views): tables, listings and plain text stop after MAX_TABLE_ROWS rows,
# the JSON after MAX_JSON_ITEMS items per list and MAX_JSON_TEXT characters per string, each cut
# saying so (the JSON's "truncated" lists them). `%magpy report FILE` writes everything.
MAX_TABLE_ROWS = 400
MAX_JSON_ITEMS = 1000
MAX_JSON_TEXT = 100_000

OP_KINDS = ("call", "binary operator", "comparison", "unary operator", "subscript",
            "attribute read", "list", "tuple", "dict", "slice", "attribute write", "item write")

BREAK_TITLES = BREAK_REASONS

# ----------------------------------------------------------------------------------------------
# [SECTION] MIME and formatting helpers
# ----------------------------------------------------------------------------------------------

_BOX = ("font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;font-size:13px;"
        "line-height:1.4;border-left:3px solid #6b46c1;padding:4px 10px;margin:4px 0;"
        "color:#1a1a1a;background:#fbfaff")
_SUMMARY = "cursor:pointer;font-weight:600;color:#3b2a73"
_TABLE = "border-collapse:collapse;margin:4px 0;font-size:12px"
_TH = ("text-align:left;padding:2px 8px;border-bottom:1px solid #c9c2e0;color:#3b2a73;"
       "font-weight:600;vertical-align:top")
_TD = "text-align:left;padding:2px 8px;border-bottom:1px solid #eeeaf6;vertical-align:top"
_CODE = "font-family:Menlo,Consolas,'DejaVu Sans Mono',monospace;font-size:12px"
_PRE = _CODE + (";background:#f6f4fb;padding:6px 8px;margin:4px 0;overflow-x:auto;"
                "white-space:pre;border-radius:3px")
_MUTED = "color:#6b6680"
_BAD = "color:#b42318;font-weight:600"
_GOOD = "color:#1e7b34;font-weight:600"


def mime_type(kind):
    return f"{MIME_PREFIX}{kind}+json"


def esc(text):
    """Escape text for HTML element content and attribute values."""
    return html.escape(str(text), quote=True)


def fmt_ns(ns):
    """A duration in nanoseconds, in the unit that reads best."""
    ns = int(ns or 0)
    if ns < 1_000:
        return f"{ns} ns"
    if ns < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def plural(n, word, words=None):
    return f"{n} {word if n == 1 else (words or word + 's')}"


def humanize(expr):
    """Replay-plan access paths in the user's terms: G['x'] -> x, L['x'] -> x."""
    return re.sub(r"\b[GL]\['([A-Za-z_]\w*)'\]", r"\1", expr)


def _cut_lines(lines, what="lines"):
    """At most MAX_TABLE_ROWS of `lines`, and a last one saying how many more there were."""
    cut = len(lines) - MAX_TABLE_ROWS
    if cut <= 0:
        return lines
    return lines[:MAX_TABLE_ROWS] + [f"… {cut} more {what} (%magpy report FILE writes all of them)"]


def _cut_json(value, path, cuts):
    """`value` with lists cut to MAX_JSON_ITEMS items and strings to MAX_JSON_TEXT characters;
    each cut is noted in `cuts` by its path."""
    if isinstance(value, dict):
        return {k: _cut_json(v, f"{path}.{k}" if path else str(k), cuts) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_JSON_ITEMS:
            cuts.append(f"{path}: {MAX_JSON_ITEMS} of {len(value)} items")
            value = value[:MAX_JSON_ITEMS]
        return [_cut_json(v, f"{path}[{i}]", cuts) for i, v in enumerate(value)]
    if isinstance(value, str) and len(value) > MAX_JSON_TEXT:
        cuts.append(f"{path}: {MAX_JSON_TEXT} of {len(value)} characters")
        return value[:MAX_JSON_TEXT]
    return value


def _bundle(kind, data, html_text, plain):
    cuts = []
    data = _cut_json(dict(data), "", cuts)
    if cuts:
        data["truncated"] = cuts
    data.setdefault("schema_version", VIEW_SCHEMA_VERSION)
    data.setdefault("kind", kind)
    plain = "\n".join(_cut_lines(plain.splitlines()))
    return {mime_type(kind): data, "text/html": html_text, "text/plain": plain}


def _section(title, summary, body_html, open_=True):
    """One view: a <details> block whose summary line carries the key numbers."""
    return (f'<div style="{_BOX}"><details{" open" if open_ else ""}>'
            f'<summary style="{_SUMMARY}">{esc(title)} '
            f'<span style="font-weight:400;{_MUTED}">{esc(summary)}</span></summary>'
            f"{body_html}</details></div>")


def _table(headers, rows, raw_cols=()):
    """rows: lists of cells; cells are escaped unless their column index is in raw_cols."""
    head = "".join(f'<th style="{_TH}">{esc(h)}</th>' for h in headers)
    body = []
    cut = len(rows) - MAX_TABLE_ROWS
    if cut > 0:
        rows = list(rows[:MAX_TABLE_ROWS]) + \
            [[f"… {cut} more rows (%magpy report FILE writes all of them)"]]
    for row in rows:
        cells = "".join(f'<td style="{_TD}">{c if i in raw_cols else esc(c)}</td>'
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return (f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _code(text):
    return f'<code style="{_CODE}">{esc(text)}</code>'


def _entries_by_id(report):
    return {e["id"]: e for e in report.get("cache_entries", [])}


def _graphs_in_order(report):
    """Graphs oldest entry first (the report lists the cache most recently used first)."""
    return sorted(report.get("graphs", []), key=lambda g: g["entry"])


def _where(ctx, filename, lineno):
    """A source location in the user's terms: 'Cell In[5], line 3' or 'file.py, line 3'."""
    if not filename:
        return ""
    if filename == ctx.get("filename"):
        return f"{ctx.get('label', 'this cell')}, line {lineno}"
    label = ctx.get("file_labels", {}).get(filename)
    if label:
        return f"{label}, line {lineno}"
    return f"{os.path.basename(filename)}, line {lineno}"


def _line_text(ctx, filename, lineno):
    if filename and filename == ctx.get("filename"):
        lines = ctx.get("source", "").splitlines()
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""
    return ctx.get("file_lines", {}).get(filename, {}).get(lineno, "")


def _with_callees(report):
    """The report with the graphs, cache entries and breaks of the callees that ran compiled on
    their own (report["callees"], nested) folded in, each graph and entry marked with its
    callee's name. An entry shared by two callees (one class, two modules) is listed once."""
    if not report.get("callees"):
        return report
    out = dict(report, graphs=list(report.get("graphs", [])),
               cache_entries=list(report.get("cache_entries", [])),
               breaks=list(report.get("breaks", [])))
    seen = {e["id"] for e in out["cache_entries"]}

    def fold(callee):
        name = callee.get("name", "")
        graphs = {g["entry"]: g for g in callee.get("graphs", [])}
        for e in callee.get("cache_entries", []):
            if e["id"] in seen:
                continue
            seen.add(e["id"])
            out["cache_entries"].append(dict(e, callee=name))
            if e["id"] in graphs:
                out["graphs"].append(dict(graphs[e["id"]], callee=name))
        out["breaks"].extend(b for b in callee.get("breaks", []) if b not in out["breaks"])
        for c in callee.get("callees", []):
            fold(c)

    for c in report["callees"]:
        fold(c)
    return out


def _graph_title(g, entry, ctx):
    where = []
    if entry.get("starts_at_line"):
        where.append(f"from line {entry['starts_at_line']}")
    if entry.get("ends_at_line"):
        where.append(f"to the break at line {entry['ends_at_line']}")
    tail = f" ({', '.join(where)})" if where else ""
    callee = f"callee {g['callee']}: " if g.get("callee") else ""
    return f"{callee}graph {g['entry']}{tail}"


# ----------------------------------------------------------------------------------------------
# [SECTION] Replay plan parsing: the plan is Python, so its dataflow is read with ast
# ----------------------------------------------------------------------------------------------

_SLOT = re.compile(r"^v(\d+)$")
_LINE_COMMENT = re.compile(r"#\s*line\s+(\d+)\s*$")


def plan_display_text(replay_python):
    """The plan as shown to users: the cell's code object is named <module> (so tracebacks read
    like a normal cell), which the engine's header spells `def replay__module_(...)`."""
    return re.sub(r"^def replay_(<module>|_module_)\(", "def replay_cell(", replay_python,
                  count=1, flags=re.M)


def _access_root(node):
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _inputs_and_uses(expr):
    """Slots (vN) and access paths (L[...] / G[...] chains) that an expression reads."""
    uses, inputs = [], []

    def visit(node, is_callee=False):
        if isinstance(node, (ast.Subscript, ast.Attribute)) and _access_root(node) in ("L", "G"):
            if not is_callee:
                inputs.append(ast.unparse(node))
            return
        if isinstance(node, ast.Name):
            m = _SLOT.match(node.id)
            if m:
                uses.append(int(m.group(1)))
            return
        if isinstance(node, ast.Call):
            visit(node.func, is_callee=True)
            for a in node.args:
                visit(a)
            for k in node.keywords:
                visit(k.value)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(expr)
    return list(dict.fromkeys(uses)), list(dict.fromkeys(inputs))


_INPLACE = re.compile(r"^(v\d+)\s*=\s*(.+?)\s*(\*\*|//|<<|>>|[-+*/%@&|^])=\s*(.+)$")
_ACCESS = re.compile(r"\b[GL]\[[^\]]*\](?:\.[A-Za-z_]\w*|\[[^\]]*\])*")


def _step_from_stmt(stmt, line):
    stmt_text = ast.unparse(stmt)
    slot, kind, value = None, "other", stmt
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        m = _SLOT.match(target.id) if isinstance(target, ast.Name) else None
        if m:
            slot, kind, value = int(m.group(1)), "op", stmt.value
            stmt_text = ast.unparse(stmt.value)
        else:
            kind = "write"
    elif isinstance(stmt, ast.Return):
        kind = "return"
        value = stmt.value if stmt.value is not None else ast.Constant(None)
    elif isinstance(stmt, (ast.Expr, ast.AugAssign)):
        kind = "write"   # a call or update kept for its effect (container mutation, ...)
    if kind == "write" and isinstance(stmt, ast.Assign):
        # a store reads its value and the container it writes into, not the name it binds
        # (a review probe: `result = x0 * 2` drew `result` as an input of the cell)
        value = stmt.value
        parts = [value]
        for target in stmt.targets:
            if isinstance(target, (ast.Subscript, ast.Attribute)):
                if not (isinstance(target.value, ast.Name) and target.value.id in ("L", "G")):
                    parts.append(target.value)
                if isinstance(target, ast.Subscript):
                    parts.append(target.slice)
        uses, inputs = [], []
        for part in parts:
            u, i = _inputs_and_uses(part)
            uses += u
            inputs += i
        return {"slot": slot, "kind": kind, "text": stmt_text,
                "uses": list(dict.fromkeys(uses)), "inputs": list(dict.fromkeys(inputs)),
                "line": line}
    uses, inputs = _inputs_and_uses(value)
    if kind == "write" and isinstance(stmt, ast.AugAssign):
        # the written location is where the effect goes, the value is what flows into it
        uses_t, _ = _inputs_and_uses(stmt.target)
        uses = list(dict.fromkeys(uses + uses_t))
    return {"slot": slot, "kind": kind, "text": stmt_text, "uses": uses, "inputs": inputs,
            "line": line}


def _step_from_text(code, line):
    """A plan line that is not Python: the engine writes an in-place op as `v9 = v8 += v3`."""
    m = _INPLACE.match(code)
    if m:
        try:
            (stmt,) = ast.parse(f"{m.group(1)} = ({m.group(2)}) {m.group(3)} ({m.group(4)})").body
            step = _step_from_stmt(stmt, line)
            step["text"] = f"{m.group(2)} {m.group(3)}= {m.group(4)}"
            return step
        except (SyntaxError, ValueError):
            pass
    slot = re.match(r"^v(\d+)\s*=", code)
    rest = code[slot.end():] if slot else code
    return {"slot": int(slot.group(1)) if slot else None, "kind": "op" if slot else "other",
            "text": rest.strip(), "uses": list(dict.fromkeys(int(u) for u in
                                                             re.findall(r"\bv(\d+)\b", rest))),
            "inputs": list(dict.fromkeys(_ACCESS.findall(rest))), "line": line}


def parse_plan(replay_python):
    """Steps of a replay plan: [{slot, text, uses, inputs, line, kind}], or None if unreadable.

    kind is 'op' for `vN = ...`, 'write' for assignments to anything else (side effects),
    'return' for the return statement and 'other' for the rest. The plan is read with ast;
    when it is not valid Python as a whole, each line is read on its own.
    """
    text = re.sub(r"^def\s+[^\s(]+\(", "def replay(", replay_python, count=1, flags=re.M)
    src_lines = text.splitlines()

    def line_of(n):
        m = _LINE_COMMENT.search(src_lines[n - 1]) if 0 < n <= len(src_lines) else None
        return int(m.group(1)) if m else None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        tree = None
    if tree is not None:
        fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        if not fns:
            return None
        return [_step_from_stmt(stmt, line_of(stmt.lineno)) for stmt in fns[0].body]
    heads = [i for i, l in enumerate(src_lines) if l.startswith("def replay(")]
    if not heads:
        return None
    steps = []
    for n in range(heads[0] + 2, len(src_lines) + 1):
        raw = src_lines[n - 1]
        m = _LINE_COMMENT.search(raw)
        code = (raw[:m.start()] if m else raw).strip()
        if not code or code.startswith("#"):
            continue
        try:
            (stmt,) = ast.parse(code).body
            steps.append(_step_from_stmt(stmt, line_of(n)))
        except (SyntaxError, ValueError):
            steps.append(_step_from_text(code, line_of(n)))
    return steps


def _match_ops(graph, steps):
    """Pair each op of a graph with its plan step: by output slot, writes in order."""
    by_slot = {s["slot"]: s for s in steps or [] if s["slot"] is not None}
    writes = [s for s in steps or [] if s["kind"] == "write"]
    out = []
    for op in graph.get("ops", []):
        step = by_slot.get(op["out"]) if op["out"] >= 0 else (writes.pop(0) if writes else None)
        out.append((op, step))
    return out


# ----------------------------------------------------------------------------------------------
# [SECTION] graphs: the operator graphs, ops with their inputs and outputs
# ----------------------------------------------------------------------------------------------

def graphs_view(report, ctx):
    entries = _entries_by_id(report)
    graphs_data, blocks, plain = [], [], []
    for g in _graphs_in_order(report):
        steps = parse_plan(g.get("replay_python", "")) or []
        ops = []
        for i, (op, step) in enumerate(_match_ops(g, steps)):
            kind = op["kind"]
            ops.append({
                "index": i, "kind": kind,
                "kind_name": OP_KINDS[kind] if 0 <= kind < len(OP_KINDS) else f"kind {kind}",
                "target": op.get("target", ""), "line": op.get("line"),
                # a line of a function defined elsewhere (another cell, a module) says where
                "where": (_where(ctx, op["filename"], op.get("line"))
                          if op.get("filename") and op["filename"] != ctx.get("filename")
                          else ""),
                "out": op["out"], "output": f"v{op['out']}" if op["out"] >= 0 else "",
                "inputs": ([f"v{u}" for u in step["uses"]] + step["inputs"]) if step else [],
                "expr": step["text"] if step else "",
            })
        title = _graph_title(g, entries.get(g["entry"], {}), ctx)
        graphs_data.append({"entry": g["entry"], "title": title, "backend": g["backend"],
                            "backend_note": g.get("backend_note", ""), "op_count": g["op_count"],
                            "ops": ops})
        rows = [[o["index"], o["output"] or "—", o["kind_name"], humanize(o["target"]) or "—",
                 ", ".join(humanize(x) for x in o["inputs"]) or "—", humanize(o["expr"]),
                 o["where"] or (o["line"] if o["line"] is not None else "")] for o in ops]
        note = (f'<div style="{_BAD}">backend note: {esc(g["backend_note"])}</div>'
                if g.get("backend_note") else "")
        blocks.append(f'<div style="margin-top:6px"><b>{esc(title)}</b> '
                      f'<span style="{_MUTED}">{esc(plural(g["op_count"], "op"))}, backend '
                      f'{esc(g["backend"])}</span>{note}'
                      + _table(["#", "output", "operation", "target", "inputs", "computes",
                                "line"], rows) + "</div>")
        plain.append(f"  {title}: {plural(g['op_count'], 'op')}, backend {g['backend']}"
                     + (f" ({g['backend_note']})" if g.get("backend_note") else ""))
        for o in ops:
            plain.append(f"    {o['output'] or '-':>4} = {humanize(o['expr']) or o['kind_name']}"
                         f"    # {o['where'] or 'line %s' % o['line']}")
    n = len(graphs_data)
    total_ops = sum(g["op_count"] for g in graphs_data)
    summary = f"{plural(n, 'graph')}, {plural(total_ops, 'op')}"
    body = "".join(blocks) or f'<div style="{_MUTED}">no graph was captured</div>'
    data = {"name": report.get("name", ""), "label": ctx.get("label", ""), "graphs": graphs_data}
    return _bundle("graphs", data, _section("magpy · operator graphs", summary, body, open_=False),
                   "\n".join([f"magpy operator graphs: {summary}"] + plain))


# ----------------------------------------------------------------------------------------------
# [SECTION] refgraph: the values of each capture and where they came from, drawn by dot
# ----------------------------------------------------------------------------------------------

def _dot_str(text, limit=60):
    text = str(text)
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def refgraph_model(report):
    """Nodes, edges and clusters to draw: one cluster per captured graph (its dataflow from the
    replay plan, with the RefGraph's relations between its inputs), breaks as octagons."""
    entries = _entries_by_id(report)
    clusters, edges, nodes = [], [], {}

    def add(node_id, **attrs):
        nodes[node_id] = attrs
        return node_id

    for g in _graphs_in_order(report):
        eid = g["entry"]
        entry = entries.get(eid, {})
        steps = parse_plan(g.get("replay_python", ""))
        members = []
        ref_nodes = entry.get("refgraph", {}).get("nodes", [])
        scope_of = {n["label"]: n["scope"] for n in ref_nodes}
        if steps is None:
            members.append(add(f"e{eid}_plan", label="plan not readable", kind="note"))
            clusters.append({"entry": eid, "nodes": members, "title": f"graph {eid}"})
            continue
        inputs = {}
        for i, s in enumerate(steps):
            for path in s["inputs"]:
                if path not in inputs:
                    inputs[path] = add(f"e{eid}_in{len(inputs)}", label=humanize(path),
                                       kind="input", path=path,
                                       scope=scope_of.get(path, "external"))
                    members.append(inputs[path])
            if s["kind"] == "op":
                nid = add(f"e{eid}_v{s['slot']}", label=f"v{s['slot']} = {humanize(s['text'])}",
                          kind="op", line=s["line"])
            elif s["kind"] == "return":
                nid = add(f"e{eid}_ret", label=f"return {humanize(s['text'])[7:]}".strip(),
                          kind="return", line=s["line"])
            else:
                nid = add(f"e{eid}_s{i}", label=humanize(s["text"]), kind="effect",
                          line=s["line"])
            members.append(nid)
            for u in s["uses"]:
                edges.append((f"e{eid}_v{u}", nid, ""))
            for path in s["inputs"]:
                edges.append((inputs[path], nid, ""))
        # RefGraph relations between values drawn here (access-path steps such as .relu)
        by_ref_id = {n["id"]: n["label"] for n in ref_nodes}
        for e in entry.get("refgraph", {}).get("edges", []):
            a, b = by_ref_id.get(e["src"]), by_ref_id.get(e["dst"])
            if a in inputs and b in inputs:
                edges.append((inputs[a], inputs[b], e["label"]))
        clusters.append({"entry": eid, "nodes": members,
                         "title": _graph_title(g, entry, {}) + f" · {g['backend']}"})
    breaks = []
    for i, b in enumerate(report.get("breaks", [])):
        nid = add(f"brk{i}", label=f"{b['reason_id']} {BREAK_TITLES.get(b['reason_id'], '')}"
                  f" · line {b['lineno']}", kind="break")
        breaks.append(nid)
        for c in clusters:
            if entries.get(c["entry"], {}).get("ends_at_line") == b["lineno"]:
                ret = f"e{c['entry']}_ret"
                edges.append((ret if ret in nodes else c["nodes"][-1], nid, "breaks here"))
    edges = [e for e in edges if e[0] in nodes and e[1] in nodes]
    return {"nodes": nodes, "edges": edges, "clusters": clusters, "breaks": breaks,
            "collapsed": []}


def collapse_model(model, max_nodes=MAX_DRAWN_NODES):
    """Above max_nodes, fold the largest graphs into one summary node each (their inputs, up to
    a cap, and the return value stay visible), largest first, until the drawing is small enough
    (TensorBoard's collapsed metanodes, in one level)."""
    nodes, edges = dict(model["nodes"]), list(model["edges"])
    clusters = [dict(c) for c in model["clusters"]]
    collapsed = []
    for c in sorted(clusters, key=lambda c: -len(c["nodes"])):
        if len(nodes) <= max_nodes:
            break
        inner = [n for n in c["nodes"] if nodes[n]["kind"] in ("op", "effect")]
        if len(inner) < 2:
            continue
        summary, more = f"e{c['entry']}_collapsed", f"e{c['entry']}_moreinputs"
        inputs = [n for n in c["nodes"] if nodes[n]["kind"] == "input"]
        hidden = set(inputs[MAX_INPUTS_PER_COLLAPSED_GRAPH:])
        inner_set = set(inner)

        def mapped(n):
            return summary if n in inner_set else (more if n in hidden else n)

        folded = []
        for a, b, label in edges:
            a2, b2 = mapped(a), mapped(b)
            if a2 != b2:
                folded.append((a2, b2, label if (a2, b2) == (a, b) else ""))
        edges = list(dict.fromkeys(folded))
        for n in inner_set | hidden:
            del nodes[n]
        nodes[summary] = {"label": f"{len(inner)} ops (collapsed)", "kind": "collapsed"}
        if hidden:
            nodes[more] = {"label": f"+{len(hidden)} more inputs", "kind": "input"}
        c["nodes"] = [n for n in c["nodes"] if n in nodes] + [summary] + ([more] if hidden else [])
        collapsed.append(c["entry"])
    return {"nodes": nodes, "edges": edges, "clusters": clusters, "breaks": model["breaks"],
            "collapsed": collapsed}


_NODE_STYLE = {
    "input": 'shape=ellipse, style=filled, fillcolor="#e0f2fe", color="#0369a1"',
    "op": 'shape=box, style="rounded,filled", fillcolor="#ede9fe", color="#6b46c1"',
    "return": 'shape=box, style="rounded,filled", fillcolor="#dcfce7", color="#15803d"',
    "effect": 'shape=box, style="filled,dashed", fillcolor="#fef3c7", color="#b45309"',
    "break": 'shape=octagon, style=filled, fillcolor="#fee2e2", color="#b91c1c", '
             'fontcolor="#7f1d1d"',
    "collapsed": 'shape=box3d, style=filled, fillcolor="#f3f4f6", color="#4b5563"',
    "note": 'shape=note, style=filled, fillcolor="#f3f4f6", color="#4b5563"',
}


def model_to_dot(model):
    out = ["digraph refgraph {",
           '  graph [rankdir=TB, fontname="Helvetica", fontsize=10, nodesep=0.25, ranksep=0.3,'
           ' bgcolor="#ffffff"];',
           '  node [fontname="Helvetica", fontsize=10, height=0.3];',
           '  edge [fontname="Helvetica", fontsize=9, color="#6b6680", arrowsize=0.6];']
    in_cluster = set()
    for i, c in enumerate(model["clusters"]):
        out.append(f"  subgraph cluster_{i} {{")
        out.append(f'    label={_dot_str(c["title"], 80)}; style="rounded"; color="#c9c2e0";'
                   ' fontcolor="#3b2a73";')
        for n in c["nodes"]:
            in_cluster.add(n)
            a = model["nodes"][n]
            out.append(f"    {n} [label={_dot_str(a['label'])}, {_NODE_STYLE[a['kind']]}];")
        out.append("  }")
    for n, a in model["nodes"].items():
        if n not in in_cluster:
            out.append(f"  {n} [label={_dot_str(a['label'])}, {_NODE_STYLE[a['kind']]}];")
    for a, b, label in model["edges"]:
        extra = f", label={_dot_str(label, 30)}, style=dashed" if label else ""
        out.append(f"  {a} -> {b} [{extra.lstrip(', ')}];")
    out.append("}")
    return "\n".join(out) + "\n"


_SVG_CACHE = OrderedDict()


def render_dot_svg(dot_source, dot_command=None, timeout_s=None):
    """Lay out DOT with graphviz: (svg text, None) or (None, why not). Never raises."""
    dot_command = dot_command or DOT_COMMAND
    timeout_s = DOT_TIMEOUT_S if timeout_s is None else timeout_s
    key = hashlib.sha1((dot_command + "\0" + dot_source).encode()).hexdigest()
    if key in _SVG_CACHE:
        _SVG_CACHE.move_to_end(key)
        return _SVG_CACHE[key], None
    exe = shutil.which(dot_command)
    if exe is None:
        return None, (f"graphviz's `{dot_command}` was not found, so the graph is shown as a "
                      "table; install graphviz (apt-get install graphviz) to see it drawn")
    try:
        proc = subprocess.run([exe, "-Tsvg", *DOT_CAPS], input=dot_source.encode(),
                              capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, (f"graphviz took longer than {timeout_s:g} s to lay out the graph, so it is "
                      "shown as a table")
    except OSError as e:
        return None, f"graphviz could not run ({e}), so the graph is shown as a table"
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        return None, ("graphviz failed (" + (err[0] if err else f"exit {proc.returncode}")
                      + "), so the graph is shown as a table")
    svg = proc.stdout.decode(errors="replace")
    start = svg.find("<svg")
    if start < 0:
        return None, "graphviz returned no SVG, so the graph is shown as a table"
    svg = re.sub(r"<!--.*?-->", "", svg[start:], flags=re.S).strip()
    _SVG_CACHE[key] = svg
    while len(_SVG_CACHE) > 32:
        _SVG_CACHE.popitem(last=False)
    return svg, None


def _svg_is_safe(svg):
    """dot writes only drawing elements; refuse anything that could run code, whatever happens."""
    low = svg.lower()
    return "<script" not in low and "javascript:" not in low and \
        re.search(r"\son\w+\s*=", low) is None and "<foreignobject" not in low


def refgraph_view(report, ctx, dot_command=None, timeout_s=None):
    full = refgraph_model(report)
    model = collapse_model(full)
    dot_source = model_to_dot(model)
    svg, why_not = (None, "nothing was captured") if not model["nodes"] else \
        render_dot_svg(dot_source, dot_command, timeout_s)
    if svg is not None and not _svg_is_safe(svg):
        svg, why_not = None, "the SVG from graphviz was refused (unexpected content)"
    n_nodes, n_edges = len(full["nodes"]), len(full["edges"])
    summary = f"{plural(n_nodes, 'value')}, {plural(n_edges, 'edge')}"
    if model["collapsed"]:
        summary += f", {plural(len(model['collapsed']), 'graph')} collapsed"
    notes = []
    if model["collapsed"]:
        notes.append(f"more than {MAX_DRAWN_NODES} values: the largest graphs are collapsed into "
                     "one node each; the graphs view lists every op")
    if why_not and model["nodes"]:
        notes.append(why_not)
    rows = []
    for c in model["clusters"]:
        for n in c["nodes"]:
            a = model["nodes"][n]
            preds = [model["nodes"][x]["label"] for x, y, _ in model["edges"] if y == n]
            rows.append([c["title"], a["kind"], a["label"], "; ".join(preds)])
    for n in model["breaks"]:
        rows.append(["", "break", model["nodes"][n]["label"], ""])
    table = _table(["graph", "kind", "value", "comes from"], rows) if rows else \
        f'<div style="{_MUTED}">nothing was captured</div>'
    notes_html = "".join(f'<div style="{_MUTED}">note: {esc(n)}</div>' for n in notes)
    if svg is not None:
        body = (f'<div style="overflow:auto;max-height:720px;background:#ffffff">{svg}</div>'
                + notes_html)
    else:
        body = notes_html + table
    legend = (f'<div style="{_MUTED};font-size:11px">blue: inputs read from the notebook '
              "(guarded) · purple: ops · dashed yellow: side effects replayed · "
              "green: result · "
              "red octagon: graph break</div>")
    data = {"name": report.get("name", ""), "label": ctx.get("label", ""),
            "layout": "svg" if svg is not None else "table", "layout_note": why_not or "",
            "collapsed_entries": model["collapsed"], "dot": dot_source,
            "node_count": n_nodes, "edge_count": n_edges,
            "refgraphs": [{"entry": e["id"], "nodes": e.get("refgraph", {}).get("nodes", []),
                           "edges": e.get("refgraph", {}).get("edges", [])}
                          for e in sorted(report.get("cache_entries", []), key=lambda e: e["id"])]}
    plain = [f"magpy reference graph: {summary}"] + [f"  note: {n}" for n in notes]
    for r in rows:
        plain.append(f"  [{r[1]}] {r[2]}" + (f"  <- {r[3]}" if r[3] else ""))
    return _bundle("refgraph", data,
                   _section("magpy · reference graph", summary, legend + body, open_=False),
                   "\n".join(plain))


# ----------------------------------------------------------------------------------------------
# [SECTION] guards
# ----------------------------------------------------------------------------------------------

def guards_view(report, ctx):
    entries = sorted(report.get("cache_entries", []), key=lambda e: e["id"])
    reasons = list(report.get("recompile_reasons", []))
    new_reasons = list(ctx.get("run", {}).get("recompile_reasons", []))
    blocks, plain = [], []
    for e in entries:
        rows = [[i + 1, _code(humanize(g)), _code(g)] for i, g in enumerate(e.get("guards", []))]
        head = ((f"callee {e['callee']}: " if e.get("callee") else "") +
                f"entry {e['id']} · {e['kind']} · {plural(e.get('hits', 0), 'hit')} · "
                f"{plural(len(e.get('guards', [])), 'guard')}")
        blocks.append(f'<div style="margin-top:6px"><b>{esc(head)}</b>'
                      + _table(["#", "condition", "as checked"], rows, raw_cols=(1, 2)) + "</div>")
        plain.append(f"  {head}")
        plain.extend(f"    {g}" for g in e.get("guards", []))
    if reasons:
        items = "".join(f'<li style="{_BAD if r in new_reasons else ""}">{esc(humanize(r))}'
                        f'{" (this run)" if r in new_reasons else ""}</li>' for r in reasons)
        blocks.insert(0, f'<div><b>recompiled because</b><ul style="margin:2px 0">{items}</ul>'
                         "</div>")
        plain.insert(0, "  recompiled because: " + "; ".join(humanize(r) for r in reasons))
    n_guards = sum(len(e.get("guards", [])) for e in entries)
    n_entries = plural(len(entries), "cache entry", "cache entries")
    summary = (f"{plural(n_guards, 'guard')} on {n_entries}"
               + (f", {plural(len(reasons), 'recompile')}" if reasons else ""))
    data = {"label": ctx.get("label", ""), "recompile_reasons": reasons,
            "recompile_reasons_this_run": new_reasons,
            "entries": [{"entry": e["id"], "kind": e["kind"], "hits": e.get("hits", 0),
                         "guards": list(e.get("guards", []))} for e in entries]}
    body = "".join(blocks) or f'<div style="{_MUTED}">no cache entry yet</div>'
    return _bundle("guards", data,
                   _section("magpy · guards", summary, body, open_=bool(new_reasons)),
                   "\n".join([f"magpy guards: {summary}"] + plain))


# ----------------------------------------------------------------------------------------------
# [SECTION] breaks: reason id, reason, hint, and the cell with the break lines highlighted
# ----------------------------------------------------------------------------------------------

def _source_listing(source, marks):
    """The cell with line numbers; marks: {lineno: [reason ids]} highlighted."""
    rows = []
    for i, text in enumerate(source.splitlines(), start=1):
        mark = marks.get(i)
        style = "background:#fee2e2;" if mark else ""
        tag = (f' <span style="{_BAD}">◀ {esc(", ".join(mark))}</span>' if mark else "")
        rows.append(f'<div style="{style}white-space:pre"><span style="{_MUTED};'
                    'display:inline-block;width:3em;text-align:right;padding-right:8px">'
                    f'{i}</span>{esc(text)}{tag}</div>')
    return (f'<div style="{_CODE};background:#f6f4fb;padding:4px 0;margin:4px 0">'
            f'{"".join(rows)}</div>')


def breaks_view(report, ctx):
    breaks = list(report.get("breaks", []))
    error_break = ctx.get("run", {}).get("error_break")
    if error_break and not any(b["reason_id"] == error_break["reason_id"] and
                               b["lineno"] == error_break["lineno"] for b in breaks):
        breaks.append(error_break)
    items, plain, marks = [], [], {}
    for b in breaks:
        where = _where(ctx, b.get("filename", ""), b.get("lineno", 0))
        line = _line_text(ctx, b.get("filename", ""), b.get("lineno", 0))
        title = BREAK_TITLES.get(b["reason_id"], "")
        items.append({**b, "title": title, "where": where, "line_text": line,
                      "in_cell": b.get("filename") == ctx.get("filename")})
        if b.get("filename") == ctx.get("filename"):
            marks.setdefault(b["lineno"], []).append(b["reason_id"])
    rows = [[f'<span style="{_BAD}">{esc(i["reason_id"])}</span>'
             f'<div style="{_MUTED}">{esc(i["title"])}</div>',
             esc(i["reason"]), esc(i["hint"]) or "—",
             esc(i["where"]) + (f'<div>{_code(i["line_text"].strip())}</div>'
                                if i["line_text"] and not i["in_cell"] else "")]
            for i in items]
    body = ""
    if items:
        body += _table(["reason", "what happened", "hint", "where"], rows, raw_cols=(0, 1, 2, 3))
        if ctx.get("source"):
            body += _source_listing(ctx["source"], marks)
    else:
        body = f'<div style="{_GOOD}">no graph break: the cell was captured whole</div>'
    # the engine's notes: what it did instead (the rest of a call run eagerly after a break,
    # a backend's fallback, the cache limit), as explain() lists them
    notes = [str(n) for n in report.get("notes", [])]
    if notes:
        body += (f'<div style="{_MUTED}">notes</div><ul>' +
                 "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    for i in items:
        plain.append(f"  [{i['reason_id']}] {i['reason']}")
        if i["where"]:
            plain.append(f"      at {i['where']}: {i['line_text'].strip()}")
        if i["hint"]:
            plain.append(f"      hint: {i['hint']}")
    plain += [f"  note: {n}" for n in notes]
    summary = plural(len(items), "break") if items else "none"
    data = {"label": ctx.get("label", ""), "breaks": items, "notes": notes,
            "cell": {"filename": ctx.get("filename", ""), "source": ctx.get("source", ""),
                     "highlight_lines": sorted(marks)}}
    return _bundle("breaks", data, _section("magpy · graph breaks", summary, body,
                                            open_=bool(items)),
                   "\n".join([f"magpy graph breaks: {summary}"] + plain))


# ----------------------------------------------------------------------------------------------
# [SECTION] plan: the replay plan ("mock code") as readable Python
# ----------------------------------------------------------------------------------------------

def _python_html(code):
    """Python with comments muted; everything escaped."""
    out = []
    for line in _cut_lines(code.splitlines()):
        m = re.search(r"(\s+#[^'\"]*)$", line)
        if m and not line.lstrip().startswith("#"):
            out.append(esc(line[:m.start()]) + f'<span style="{_MUTED}">{esc(m.group(1))}</span>')
        elif line.lstrip().startswith("#"):
            out.append(f'<span style="{_MUTED}">{esc(line)}</span>')
        else:
            out.append(esc(line))
    return f'<pre style="{_PRE}">' + "\n".join(out) + "</pre>"


def plan_view(report, ctx):
    entries = _entries_by_id(report)
    plans, blocks, plain = [], [], []
    for g in _graphs_in_order(report):
        e = entries.get(g["entry"], {})
        code = plan_display_text(g.get("replay_python", ""))
        title = _graph_title(g, e, ctx)
        plans.append({"entry": g["entry"], "title": title, "python": code,
                      "starts_at_line": e.get("starts_at_line"),
                      "ends_at_line": e.get("ends_at_line")})
        blocks.append(f'<div style="margin-top:6px"><b>{esc(title)}</b>{_python_html(code)}</div>')
        plain.append(f"  {title}:")
        plain.extend("    " + l for l in code.rstrip().splitlines())
    summary = plural(len(plans), "plan")
    intro = (f'<div style="{_MUTED}">what runs on the next call when the guards pass: the '
             "captured graph, then every side effect in program order</div>")
    if any("$stack" in p["python"] for p in plans):  # a segment after a graph break
        why = ("L['$stack0'], L['$stack1'], ...: what Python had on its stack where the code "
               "before broke off (a loop's iterator, a call's pending arguments), handed to the "
               "code after the break")
        intro += f'<div style="{_MUTED}">{esc(why)}</div>'
        plain.append("  " + why)
    body = intro + "".join(blocks) if plans else \
        f'<div style="{_MUTED}">no replay plan: nothing was captured as a graph</div>'
    return _bundle("plan", {"label": ctx.get("label", ""), "plans": plans},
                   _section("magpy · replay plan", summary, body, open_=False),
                   "\n".join([f"magpy replay plan: {summary}"] + plain))


# ----------------------------------------------------------------------------------------------
# [SECTION] timings
# ----------------------------------------------------------------------------------------------

def timings_view(report, ctx):
    run = ctx.get("run", {})
    t = report.get("timings_ns", {})
    entries = sorted(report.get("cache_entries", []), key=lambda e: e["id"])
    rows = [["this run (wall clock)", fmt_ns(run.get("wall_ns", 0)), run.get("outcome", "")],
            ["capture, all runs", fmt_ns(t.get("capture", 0)),
             plural(report.get("captures", 0), "capture")],
            ["compile, all runs", fmt_ns(t.get("compile", 0)),
             f"backend {report.get('backend', '')}"]]
    calls = report.get("calls", 0)
    hits = report.get("cache_hits", 0) + report.get("resume_hits", 0)
    rows.append(["guards, all runs", fmt_ns(t.get("guard", 0)),
                 f"{fmt_ns(t.get('guard', 0) / calls)} a call" if calls else ""])
    rows.append(["replay, all runs", fmt_ns(t.get("replay", 0)),
                 f"{fmt_ns(t.get('replay', 0) / hits)} a cache hit" if hits else ""])
    erows = [[e["id"], e["kind"], fmt_ns(e.get("capture_ns", 0)), fmt_ns(e.get("compile_ns", 0)),
              fmt_ns(e.get("replay_ns", 0)), e.get("instructions", 0), e.get("hits", 0)]
             for e in entries]
    counts = (f"{plural(report.get('calls', 0), 'run')}: {report.get('cache_hits', 0)} replayed, "
              f"{report.get('cache_misses', 0)} missed the cache, "
              f"{report.get('eager_calls', 0)} eager")
    body = (_table(["phase", "time", ""], rows) + f'<div style="{_MUTED}">{esc(counts)}</div>'
            + (_table(["entry", "kind", "capture", "compile", "replay", "instructions", "hits"],
                      erows)
               if erows else ""))
    summary = f"{fmt_ns(run.get('wall_ns', 0))} this run" if run else counts
    data = {"label": ctx.get("label", ""), "wall_ns": int(run.get("wall_ns", 0)),
            "outcome": run.get("outcome", ""), "timings_ns": dict(t),
            "calls": report.get("calls", 0), "cache_hits": report.get("cache_hits", 0),
            "cache_misses": report.get("cache_misses", 0),
            "eager_calls": report.get("eager_calls", 0), "captures": report.get("captures", 0),
            "entries": [{"entry": e["id"], "kind": e["kind"], "capture_ns": e.get("capture_ns", 0),
                         "compile_ns": e.get("compile_ns", 0),
                         "replay_ns": e.get("replay_ns", 0),
                         "instructions": e.get("instructions", 0), "hits": e.get("hits", 0)}
                        for e in entries]}
    plain = [f"magpy timings: {summary}"] + [f"  {r[0]}: {r[1]} {r[2]}".rstrip() for r in rows] + \
        [f"  {counts}"]
    return _bundle("timings", data, _section("magpy · timings", summary, body, open_=False),
                   "\n".join(plain))


# ----------------------------------------------------------------------------------------------
# [SECTION] progress: the live view while the cell runs
# ----------------------------------------------------------------------------------------------

PHASES = ("starting", "capturing", "running", "done", "error", "interrupted")
_PHASE_COLOR = {"starting": "#6b46c1", "capturing": "#6b46c1", "running": "#6b46c1",
                "compiling": "#6b46c1",
                "done": "#1e7b34", "error": "#b42318", "interrupted": "#b45309"}


def progress_text(state):
    """One line (plus notes) saying where the cell is."""
    phase = state.get("phase", "starting")
    label = state.get("label", "cell")
    elapsed = fmt_ns(int(state.get("elapsed_s", 0.0) * 1e9))
    if phase == "starting":
        head = f"magpy {label}: preparing"
    elif phase == "capturing":
        head = f"magpy {label}: capturing (first run under this backend) · {elapsed}"
    elif phase == "running":
        head = f"magpy {label}: running (replays if the guards pass) · {elapsed}"
    elif phase == "compiling":
        head = f"magpy {label}: compiling with {state.get('backend', 'the backend')} · {elapsed}"
    else:
        word = {"done": "done", "error": "failed", "interrupted": "interrupted"}[phase]
        head = f"magpy {label}: {word} in {elapsed}"
        if state.get("outcome"):
            head += f" · {state['outcome']}"
        counts = []
        if "graphs" in state:
            counts.append(plural(state["graphs"], "graph"))
            counts.append(plural(state.get("ops", 0), "op"))
            counts.append(plural(state.get("breaks", 0), "break"))
        if state.get("capture_ns") or state.get("compile_ns"):
            counts.append(f"capture {fmt_ns(state.get('capture_ns', 0))}")
            counts.append(f"compile {fmt_ns(state.get('compile_ns', 0))}")
        if counts:
            head += " · " + ", ".join(counts)
    if phase in ("capturing", "running", "compiling") and state.get("captures_seen"):
        # what the engine reported so far (its progress hook)
        head += (f" · so far {plural(state.get('graphs_seen', 0), 'graph')}, "
                 f"{plural(state.get('ops_seen', 0), 'op')}, "
                 f"{plural(state.get('breaks_seen', 0), 'break')}")
    lines = [head]
    if state.get("error"):
        lines.append(f"error: {state['error']}")
    for r in state.get("recompile_reasons", []):
        lines.append(f"recompiled because {humanize(r)}")
    for n in state.get("notes", []):
        lines.append(f"note: {n}")
    return lines


def progress_view(state):
    lines = progress_text(state)
    phase = state.get("phase", "starting")
    color = _PHASE_COLOR.get(phase, "#6b46c1")
    rest = "".join(f'<div style="{_BAD if l.startswith("error:") else _MUTED}">{esc(l)}</div>'
                   for l in lines[1:])
    box = _BOX.replace("#6b46c1", color)
    html_text = (f'<div style="{box}"><span style="font-weight:600;color:{color}">'
                 f"{esc(lines[0])}</span>{rest}</div>")
    data = {k: v for k, v in state.items() if isinstance(v, (str, int, float, bool, list, dict))
            or v is None}
    data["phase"] = phase
    return _bundle("progress", data, html_text, "\n".join(lines))


# ----------------------------------------------------------------------------------------------
# [SECTION] all views
# ----------------------------------------------------------------------------------------------

_BUILDERS = {"graphs": graphs_view, "refgraph": refgraph_view, "guards": guards_view,
             "breaks": breaks_view, "plan": plan_view, "timings": timings_view}


def build_view(kind, report, ctx):
    if kind not in _BUILDERS:
        raise ValueError(f"unknown magpy view {kind!r}; the views are {', '.join(KINDS)}")
    return _BUILDERS[kind](_with_callees(report), ctx)


def all_views(report, ctx, kinds=KINDS):
    """[(kind, bundle)] in display order."""
    return [(k, build_view(k, report, ctx)) for k in kinds]
