"""Explanation: the report of a compiled callable, with the fields of DESIGN.md section 4."""

import json
import sys
from dataclasses import dataclass


# Short titles of the break reason ids. The ids and what each means are defined in
# core/src/capture/break_reasons.h; never renumber one, only add.
BREAK_REASONS = {
    "MB001": "branch on tensor values",
    "MB002": "tensor to Python value",
    "MB003": "unsupported callee",
    "MB004": "unsupported bytecode",
    "MB005": "I/O",
    "MB006": "exception inside the capture",
    "MB007": "unsupported attribute",
    "MB008": "caller's container read after a write",
    "MB009": "escaping object",
    "MB010": "data-dependent shape",
    "MB011": "no Python code",
    "MB012": "another tracer active",
    "MB013": "cache limit",
    "MB014": "op in try after a write",
    "MB015": "capture too large",
    "MB016": "generator left inside its cleanup",
    "MB099": "INTERNAL ENGINE ERROR",
}


def _n(count, one, many=None):
    """`count` things, in the number the count needs: 1 entry, 2 entries."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _notebook_cell(filename, shell=None):
    """'Cell In[5]' for the file IPython compiled cell 5 as (as its tracebacks name it), or
    None outside IPython or for any other file. `shell`: IPython's (the running one if None)."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = getattr(ipython, "get_ipython", lambda: None)() if ipython else None
    fmap = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = fmap.get(filename) if isinstance(fmap, dict) else None
    return f"Cell In[{number}]" if number is not None else None


@dataclass(frozen=True)
class GraphBreak:
    reason_id: str
    reason: str
    hint: str
    filename: str
    lineno: int
    function: str

    def __str__(self):
        where = ""
        if self.filename:
            cell = _notebook_cell(self.filename)
            where = (f"{cell}, line {self.lineno}" if cell else f"{self.filename}:{self.lineno}") \
                + (f" in {self.function}" if self.function != "<module>" or not cell else "")
        return f"[{self.reason_id}] {self.reason}" + (f"\n    at {where}" if where else "") + \
            (f"\n    hint: {self.hint}" if self.hint else "")


class Explanation:
    def __init__(self, report_json):
        self._json = report_json if isinstance(report_json, str) else json.dumps(report_json)
        self.report = json.loads(report_json) if isinstance(report_json, str) else report_json
        r = self.report
        self.name = r["name"]
        self.graph_count = r["graph_count"]
        self.breaks = [GraphBreak(**b) for b in r["breaks"]]
        self.break_count = len(self.breaks)
        self.cache_entries = len(r["cache_entries"])
        self.cache_hits = r["cache_hits"]
        self.cache_misses = r["cache_misses"]
        # calls of the code after a graph break (resume functions), counted apart
        self.resume_hits = r["resume_hits"]
        self.resume_misses = r["resume_misses"]
        self.recompile_reasons = list(r["recompile_reasons"])
        self.guards = [g for e in r["cache_entries"] for g in e["guards"]]
        self.notes = list(r["notes"])
        self.graphs = r["graphs"]
        self.op_count = sum(g["op_count"] for g in self.graphs)
        # nanoseconds, summed over calls: capture, compile, guard (every call), replay (hits)
        self.timings = dict(r["timings_ns"])
        self.profiler = dict(r.get("profiler", {}))
        # per cache entry id: GPU work recorded while its graph ran (magpy.profile())
        self.kernels = {e["id"]: e["kernels"] for e in r["cache_entries"] if "kernels" in e}
        # callees that broke inside, run as compiled callables of their own: one Explanation
        # each (their graphs and breaks are not counted above)
        self.callees = [Explanation(c) for c in r.get("callees", [])]

    def to_json(self):
        return self._json

    def replay_code(self):
        """The replay plan of each graph, as readable Python."""
        return [g["replay_python"] for g in self.graphs]

    def __str__(self):
        lines = [f"magpy explanation of {self.name}",
                 f"  graphs: {self.graph_count}   breaks: {self.break_count}   "
                 f"ops: {self.op_count}",
                 f"  cache: {_n(self.cache_entries, 'entry', 'entries')}, "
                 f"{_n(self.cache_hits, 'hit')}, {_n(self.cache_misses, 'miss', 'misses')}" +
                 (f" (after breaks: {_n(self.resume_hits, 'hit')}, "
                  f"{_n(self.resume_misses, 'miss', 'misses')})"
                  if self.resume_hits or self.resume_misses else "")]
        calls = max(r_calls := self.report.get("calls", 0), 1)
        hits = max(self.cache_hits + self.resume_hits, 1)
        t = self.timings
        lines.append(f"  time: capture {t['capture'] / 1e6:.2f} ms, compile "
                     f"{t['compile'] / 1e6:.2f} ms, guards {t['guard'] / calls / 1e3:.1f} us/call, "
                     f"replay {t['replay'] / hits / 1e3:.1f} us/hit ({_n(r_calls, 'call')})")
        for g in self.graphs:
            if g.get("backend_summary"):
                lines.append(f"  {g['backend']} (entry {g['entry']}): {g['backend_summary']}")
        for entry, k in self.kernels.items():
            lines.append(f"  GPU (entry {entry}): {k['count']} kernels/copies, "
                         f"{k['device_ns'] / 1e6:.3f} ms device time")
        for b in self.breaks:
            lines.append("  break " + str(b).replace("\n", "\n  "))
        for c in self.callees:
            lines.append(f"  callee {c.name} (it broke inside) ran compiled on its own: "
                         f"{_n(c.graph_count, 'graph')}, {_n(c.break_count, 'break')}, "
                         f"{_n(c.report['calls'], 'call')}")
        for why in self.recompile_reasons:
            lines.append(f"  recompiled because {why}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        if self.guards:
            lines.append("  guards:")
            lines.extend("    " + g for g in self.guards)
        entries = {e["id"]: e for e in self.report["cache_entries"]}
        for g in self.graphs:
            e = entries.get(g["entry"], {})
            code = g["replay_python"]
            where = []
            if "starts_at_line" in e:
                where.append(f"resumes at line {e['starts_at_line']}")
            if "ends_at_line" in e:
                where.append(f"ends at the break on line {e['ends_at_line']}")
            lines.append("  replay plan" + (f" ({', '.join(where)})" if where else "") + ":")
            lines.extend("    " + l for l in code.rstrip().splitlines())
        for c in self.callees:
            lines.extend("  " + l for l in str(c).splitlines())
        return "\n".join(lines)

    __repr__ = __str__
