"""magpy._views as pure functions (report dict -> mimebundle) and the LiveView throttle, on
synthetic reports: graphviz present, missing or too slow; collapsing large graphs; escaping of
hostile text; the replay-plan dataflow."""

import shutil
import stat
import time

import pytest

from conftest import check_html

from magpy import _views
from magpy._ipython import LiveView, parse_break_message, run_summary

HOSTILE = "<script>alert('x')</script> & \"q\" <img src=x onerror=alert(1)>"


def fake_report(n_ops=3, hostile=False, breaks=0):
    """A schema-shaped report with one graph of n_ops chained ops."""
    name = HOSTILE if hostile else "x"
    lines = ["def replay_<module>(L, G):",
             "    # L: the frame's arguments, G: its globals; guards have already passed",
             f"    v0 = G['torch'].relu(G[{name!r}])                  # line 2"]
    ops = [{"kind": 0, "target": "G['torch'].relu", "line": 2, "out": 0}]
    for i in range(1, n_ops):
        lines.append(f"    v{i} = v{i - 1} * 2.0                          # line {2 + i}")
        ops.append({"kind": 1, "target": "", "line": 2 + i, "out": i})
    lines.append(f"    G['y'] = v{n_ops - 1}                              # line {n_ops + 1}")
    lines.append(f"    return v{n_ops - 1}")
    plan = "\n".join(lines) + "\n"
    guard = f"G[{name!r}] == 1.0" if hostile else "type(G['x']) is Tensor"
    brk = [{"reason_id": "MB005", "reason": HOSTILE if hostile else "`print()` does I/O",
            "hint": HOSTILE if hostile else "move it out", "filename": "<cell>", "lineno": 2,
            "function": "<module>"}] * breaks
    entry = {"id": 1, "kind": "graph", "hits": 2, "guards": [guard], "capture_ns": 1500,
             "compile_ns": 20, "instructions": 10, "breaks": [],
             "refgraph": {"nodes": [{"id": 1, "kind": "input", "scope": "external",
                                     "label": "G['torch']"},
                                    {"id": 2, "kind": "input", "scope": "external",
                                     "label": "G['torch'].relu"}],
                          "edges": [{"src": 1, "dst": 2, "label": ".relu"}]},
             "replay_python": plan}
    return {"schema_version": 1, "name": "<module>", "backend": "eager", "fullgraph": False,
            "calls": 3, "cache_hits": 2, "cache_misses": 1, "resume_hits": 0,
            "resume_misses": 0, "captures": 1, "eager_calls": 0,
            "timings_ns": {"capture": 1500, "compile": 20}, "breaks": brk,
            "recompile_reasons": [HOSTILE] if hostile else [], "notes": [],
            "graphs": [{"entry": 1, "backend": "eager",
                        "backend_note": HOSTILE if hostile else "", "op_count": n_ops,
                        "ops": ops, "replay_python": plan}],
            "cache_entries": [entry], "graph_count": 1, "break_count": breaks}


CTX = {"label": "Cell In[7]", "filename": "<cell>", "source": "%%magpy\nprint(x)\ny = x * 2\n",
       "run": {"wall_ns": 2_500_000, "outcome": "replayed from the cache",
               "recompile_reasons": []}}


def test_every_view_escapes_hostile_text_and_parses():
    report = fake_report(hostile=True, breaks=1)
    ctx = dict(CTX, source="%%magpy\n" + HOSTILE + "\n", label=HOSTILE)
    for kind, bundle in _views.all_views(report, ctx):
        text = check_html(bundle["text/html"])
        assert "<script" not in bundle["text/html"].lower()
        assert "<img" not in bundle["text/html"].lower()
        if kind in ("breaks", "guards"):
            assert "<script>alert('x')</script>" in text, kind   # shown, as text
    page = _views.progress_view({"phase": "error", "label": HOSTILE, "error": HOSTILE,
                                 "elapsed_s": 1.0})["text/html"]
    assert "<script>alert" in check_html(page) and "<script" not in page


def test_graphs_view_lists_ops_with_inputs_and_outputs():
    b = _views.graphs_view(fake_report(n_ops=3), CTX)
    (g,) = b["application/vnd.magpy.graphs+json"]["graphs"]
    assert [(o["output"], o["inputs"]) for o in g["ops"]] == \
        [("v0", ["G['x']"]), ("v1", ["v0"]), ("v2", ["v1"])]
    assert g["ops"][0]["kind_name"] == "call" and g["ops"][1]["kind_name"] == "binary operator"
    assert "v1 = v0 * 2.0" in b["text/plain"]


def test_parse_plan_reads_dataflow_and_effects():
    steps = _views.parse_plan(fake_report(n_ops=2)["graphs"][0]["replay_python"])
    assert [s["kind"] for s in steps] == ["op", "op", "write", "return"]
    assert steps[0]["inputs"] == ["G['x']"] and steps[0]["uses"] == [] and steps[0]["line"] == 2
    assert steps[2]["uses"] == [1] and steps[3]["uses"] == [1]
    assert _views.parse_plan("not python (") is None


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz is not installed")
def test_refgraph_is_an_svg_laid_out_by_dot():
    b = _views.refgraph_view(fake_report(n_ops=4, breaks=1), CTX)
    data = b["application/vnd.magpy.refgraph+json"]
    assert data["layout"] == "svg", data["layout_note"]
    page = b["text/html"]
    assert "<svg" in page and "<?xml" not in page and "<!DOCTYPE" not in page
    text = check_html(page)
    assert "v3 = v2 * 2.0" in text and "MB005" in text and "relu" in text
    assert "cluster_0" in data["dot"] and "octagon" in data["dot"]


def test_refgraph_without_dot_falls_back_to_a_table():
    b = _views.refgraph_view(fake_report(), CTX, dot_command="no-such-dot-binary")
    data = b["application/vnd.magpy.refgraph+json"]
    assert data["layout"] == "table" and "not found" in data["layout_note"]
    text = check_html(b["text/html"])
    assert "<svg" not in b["text/html"] and "v1 = v0 * 2.0" in text and "apt-get install" in text


def test_refgraph_layout_that_takes_too_long_is_cut_off(tmp_path):
    slow = tmp_path / "slowdot"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    t0 = time.monotonic()
    b = _views.refgraph_view(fake_report(n_ops=5), CTX, dot_command=str(slow), timeout_s=0.5)
    assert time.monotonic() - t0 < 5
    data = b["application/vnd.magpy.refgraph+json"]
    assert data["layout"] == "table" and "longer than 0.5 s" in data["layout_note"]
    check_html(b["text/html"])


def test_large_graphs_are_collapsed_before_layout():
    report = fake_report(n_ops=600)
    model = _views.collapse_model(_views.refgraph_model(report))
    assert model["collapsed"] == [1]
    assert len(model["nodes"]) <= _views.MAX_DRAWN_NODES
    labels = [a["label"] for a in model["nodes"].values()]
    assert "601 ops (collapsed)" in labels, labels
    # the input and the returned value stay visible, joined through the collapsed node
    kinds = {a["kind"] for a in model["nodes"].values()}
    assert {"input", "collapsed", "return"} <= kinds
    ends = {(model["nodes"][a]["kind"], model["nodes"][b]["kind"]) for a, b, _ in model["edges"]}
    assert ("input", "collapsed") in ends and ("collapsed", "return") in ends
    b = _views.refgraph_view(report, CTX)
    data = b["application/vnd.magpy.refgraph+json"]
    assert data["collapsed_entries"] == [1] and data["node_count"] > 600
    assert "collapsed" in b["text/plain"]
    # small graphs are left alone
    assert _views.collapse_model(_views.refgraph_model(fake_report(n_ops=5)))["collapsed"] == []


def test_breaks_view_marks_lines_in_the_cell_and_elsewhere():
    report = fake_report(breaks=1)
    report["breaks"].append({"reason_id": "MB003", "reason": "calls an unknown C function",
                             "hint": "", "filename": "/lib/other.py", "lineno": 9,
                             "function": "g"})
    ctx = dict(CTX, file_labels={"/lib/other.py": "Cell In[3]"},
               file_lines={"/lib/other.py": {9: "    return mystery(t)"}})
    b = _views.breaks_view(report, ctx)
    data = b["application/vnd.magpy.breaks+json"]
    assert [x["where"] for x in data["breaks"]] == ["Cell In[7], line 2", "Cell In[3], line 9"]
    assert data["cell"]["highlight_lines"] == [2]
    text = check_html(b["text/html"])
    assert "return mystery(t)" in text and "◀ MB005" in text
    assert "at Cell In[3], line 9: return mystery(t)" in b["text/plain"]


def test_plan_view_renames_the_cell_function_and_keeps_the_code():
    b = _views.plan_view(fake_report(), CTX)
    (p,) = b["application/vnd.magpy.plan+json"]["plans"]
    assert p["python"].startswith("def replay_cell(L, G):")
    compile(p["python"], "<plan>", "exec")
    assert "def replay_cell(L, G):" in check_html(b["text/html"])


def test_timings_view_reports_this_run_and_totals():
    b = _views.timings_view(fake_report(), CTX)
    data = b["application/vnd.magpy.timings+json"]
    assert data["wall_ns"] == 2_500_000 and data["timings_ns"] == {"capture": 1500,
                                                                   "compile": 20}
    assert "2.50 ms" in b["text/plain"] and "replayed from the cache" in b["text/plain"]
    assert _views.fmt_ns(999) == "999 ns" and _views.fmt_ns(2_000_000_000) == "2.00 s"


def test_live_view_throttle_with_a_fake_clock():
    now = [0]                          # milliseconds, so that the arithmetic is exact
    sent = []
    live = LiveView(lambda b, d, u: sent.append((b, d, u)), min_interval=100,
                    clock=lambda: now[0], mode="threaded")
    live.show("s0")
    for i in range(1, 50):            # 49 updates within 490 ms
        now[0] = i * 10
        live.update(f"s{i}")
    assert [s[0] for s in sent] == ["s0", "s10", "s20", "s30", "s40"]
    now[0] = 495
    live.flush()                       # too soon after s40: stays pending
    assert len(sent) == 5
    now[0] = 520
    live.flush()                       # the newest pending state goes out
    assert sent[-1][0] == "s49"
    live.finish("final")               # always sent, even right after another update
    assert sent[-1] == ("final", live.display_id, True)
    live.update("late")                # nothing after the final state
    assert sent[-1][0] == "final"
    assert {s[1] for s in sent} == {live.display_id} and sent[0][2] is False


def test_parse_break_message_and_run_summary():
    msg = ("[MB001] a branch depends on the values inside tensor (x > 0)\n"
           "  at /tmp/cell.py:3 in <module>\n  hint: use torch.where")
    assert parse_break_message(msg) == {
        "reason_id": "MB001", "reason": "a branch depends on the values inside tensor (x > 0)",
        "hint": "use torch.where", "filename": "/tmp/cell.py", "lineno": 3,
        "function": "<module>"}
    assert parse_break_message("something else") is None
    before = fake_report()
    after = dict(before, captures=2, recompile_reasons=["`w`: expected 2.0, got 3.0"])
    s = run_summary(before, after, 1000, first_run=False)
    assert s["outcome"] == "recaptured" and s["recompile_reasons"] == after["recompile_reasons"]
    s = run_summary(before, dict(before, cache_hits=3), 1000, first_run=False)
    assert s["outcome"] == "replayed from the cache" and s["recompile_reasons"] == []


def test_every_part_of_a_huge_view_is_cut_and_says_so():
    # a review probe: a 3000-step loop wrote 4.6 MB of views into the notebook
    n = _views.MAX_JSON_ITEMS + 10
    report = fake_report(n_ops=n)
    for kind, build in (("graphs", _views.graphs_view), ("plan", _views.plan_view)):
        b = build(report, CTX)
        lines = b["text/plain"].splitlines()
        assert len(lines) == _views.MAX_TABLE_ROWS + 1, (kind, len(lines))
        assert lines[-1].startswith("… ") and "%magpy report FILE" in lines[-1]
        assert b["text/html"].count("\n") < _views.MAX_TABLE_ROWS + 50, kind
        assert len(b["text/html"]) < 500_000, (kind, len(b["text/html"]))
    data = _views.graphs_view(report, CTX)["application/vnd.magpy.graphs+json"]
    assert len(data["graphs"][0]["ops"]) == _views.MAX_JSON_ITEMS
    assert data["truncated"] == [f"graphs[0].ops: {_views.MAX_JSON_ITEMS} of {n} items"]
    long_text = {"plans": [{"python": "x\n" * _views.MAX_JSON_TEXT}]}
    cut = _views._bundle("plan", long_text, "", "")["application/vnd.magpy.plan+json"]
    assert len(cut["plans"][0]["python"]) == _views.MAX_JSON_TEXT and cut["truncated"]


def test_long_tables_are_cut_but_the_json_keeps_everything():
    b = _views.graphs_view(fake_report(n_ops=_views.MAX_TABLE_ROWS + 50), CTX)
    assert len(b["application/vnd.magpy.graphs+json"]["graphs"][0]["ops"]) == \
        _views.MAX_TABLE_ROWS + 50
    text = check_html(b["text/html"])
    assert "… 50 more rows" in text
    assert b["text/html"].count("<tr>") == _views.MAX_TABLE_ROWS + 2   # + header + the note


def test_plan_lines_that_are_not_python_are_read_one_by_one():
    # the engine renders an in-place op as `v2 = v1 += v0`, which is not Python
    plan = ("def replay_<module>(L, G):\n    # comment\n"
            "    v0 = G['m'].conv(G['x'])      # line 3\n"
            "    v1 = G['m'].bn(v0)            # line 4\n"
            "    v2 = v1 += v0                 # line 5\n"
            "    v3 = weird syntax ?? v2 G['y'] # line 6\n"
            "    return v3\n")
    steps = _views.parse_plan(plan)
    assert [(s["slot"], s["kind"]) for s in steps] == \
        [(0, "op"), (1, "op"), (2, "op"), (3, "op"), (None, "return")]
    assert steps[2]["uses"] == [1, 0] and steps[2]["text"] == "v1 += v0" and steps[2]["line"] == 5
    assert steps[3]["uses"] == [2] and steps[3]["inputs"] == ["G['y']"]
    model = _views.refgraph_model({"graphs": [{"entry": 1, "backend": "eager", "op_count": 4,
                                               "ops": [], "replay_python": plan}],
                                   "cache_entries": [], "breaks": []})
    edges = {(model["nodes"][a]["label"], model["nodes"][b]["label"]) for a, b, _ in model["edges"]}
    assert ("v1 = m.bn(v0)", "v2 = v1 += v0") in edges
    assert ("v0 = m.conv(x)", "v2 = v1 += v0") in edges
