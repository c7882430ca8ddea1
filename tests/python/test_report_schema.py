"""The report behind magpy.explain(cf).to_json() against its JSON Schema
(share/magpy-report.schema.json): real reports of every shape validate, hold the facts that tie
their fields together, and a schema that accepted anything would fail the negative tests."""

import copy
import json
import os
import re
import threading

import jsonschema
import pytest
import torch
import torch.nn as nn

import magpy
from conftest import ROOT, check

SCHEMA_PATH = os.path.join(ROOT, "share", "magpy-report.schema.json")
REPORT_H = os.path.join(ROOT, "core", "src", "report", "report.h")

with open(SCHEMA_PATH) as fh:
    SCHEMA = json.load(fh)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def report(cf):
    """The report of `cf` as a dict, parsed from the JSON text explain() hands out."""
    return json.loads(magpy.explain(cf).to_json())


def schema_errors(r):
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                  for e in VALIDATOR.iter_errors(r))


def assert_valid(r):
    errors = schema_errors(r)
    assert not errors, "report does not match the schema:\n  " + "\n  ".join(errors)


def assert_consistent(r):
    """Facts across fields that the schema alone cannot express."""
    assert r["schema_version"] == SCHEMA["properties"]["schema_version"]["const"]
    assert r["graph_count"] == len(r["graphs"])
    assert r["break_count"] == len(r["breaks"])
    assert r["cache_hits"] + r["cache_misses"] == r["calls"]

    entries = {}
    for e in r["cache_entries"]:
        assert e["kind"] in ("graph", "eager")
        assert e["id"] not in entries, f"duplicate cache entry id {e['id']}"
        entries[e["id"]] = e
        node_ids = [n["id"] for n in e["refgraph"]["nodes"]]
        assert len(node_ids) == len(set(node_ids)), f"entry {e['id']}: duplicate node ids"
        for edge in e["refgraph"]["edges"]:
            assert edge["src"] in node_ids, f"entry {e['id']}: edge {edge} from an unknown node"
            assert edge["dst"] in node_ids, f"entry {e['id']}: edge {edge} to an unknown node"
        if e["kind"] == "eager":
            assert e["breaks"], f"eager entry {e['id']} without the break that made it eager"
        for b in e["breaks"]:
            assert b in r["breaks"], f"entry {e['id']}: break {b} missing from the top level"

    for c in r["callees"]:  # callees compiled on their own: reports of the same layout
        assert c["calls"] >= 1
        assert_consistent(c)

    graph_entries = [g["entry"] for g in r["graphs"]]
    assert sorted(graph_entries) == sorted(i for i, e in entries.items() if e["kind"] == "graph")
    for g in r["graphs"]:
        assert g["op_count"] == len(g["ops"])
        assert g["replay_python"] == entries[g["entry"]]["replay_python"]


# [SECTION] the schema file itself --------------------------------------------------------------

def test_schema_is_a_valid_schema():
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_schema_version_matches_the_header():
    with open(REPORT_H) as fh:
        m = re.search(r"kReportSchemaVersion\s*=\s*(\d+)\s*;", fh.read())
    assert m, "kReportSchemaVersion not found in report.h"
    assert SCHEMA["properties"]["schema_version"]["const"] == int(m.group(1))


def _object_schemas(node, path="#"):
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for k, v in node.items():
            yield from _object_schemas(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _object_schemas(v, f"{path}/{i}")


def test_every_field_is_described_and_objects_are_closed():
    for path, obj in _object_schemas(SCHEMA):
        if "type" not in obj:  # the if/then/else fragments of an object schema
            continue
        assert obj["additionalProperties"] is False, f"{path}: open object"
        assert set(obj["required"]) <= set(obj["properties"]), f"{path}: unknown required key"
        for name, prop in obj["properties"].items():
            assert prop.get("description"), f"{path}/properties/{name}: no description"


# [SECTION] real reports ------------------------------------------------------------------------

def plain_tensor_fn():
    def f(x, y):
        return torch.relu(x) * y + x.sum()

    calls = [(torch.randn(3), torch.randn(3)), (torch.randn(3), torch.randn(3)),
             (torch.randn(2, 4), torch.randn(2, 4)), (torch.randn(3), torch.randn(3))]
    cf = check(f, calls)
    r = report(cf)
    assert r["graph_count"] == 2 and r["break_count"] == 0
    assert r["recompile_reasons"], "the rank change should be recorded as a recompile"
    assert r["cache_hits"] == 2 and r["cache_misses"] == 2
    return r


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        self.scale = 0.5

    def forward(self, x):
        return self.body(x) * self.scale


def module_with_sequential():
    torch.manual_seed(0)
    m = Net()
    cf = check(m, [torch.randn(3, 4) for _ in range(3)])
    r = report(cf)
    assert r["graph_count"] == 1 and r["break_count"] == 0
    assert r["graphs"][0]["op_count"] >= 1
    return r


def uses_item(x):
    k = x.sum().item()
    if k > 0:
        return x * k
    return x - k


def graph_break():
    """A break that resumes: a segment ending at the break, and the rest resumed after it."""
    x = torch.randn(3)
    cf = check(uses_item, [x, x, x, x])
    r = report(cf)
    assert r["break_count"] >= 1
    assert any("ends_at_line" in e for e in r["cache_entries"])
    assert any("starts_at_line" in e for e in r["cache_entries"])
    b = r["breaks"][0]
    assert b["function"] == "uses_item" and b["filename"].endswith("test_report_schema.py")
    return r


def catches(x):
    try:  # raised by an op that the guards do not decide: the call runs eagerly
        return x.index_select(0, torch.tensor([7]))
    except (IndexError, RuntimeError):
        return x + 1


LOCK = threading.Lock()


def user_with_block(x):
    y = x * 2
    with LOCK:  # a context manager in C: its block cannot be a replay step
        return y + 1


def eager_break():
    """A break that cannot be resumed (MB004): the call runs eagerly (an eager entry)."""
    cf = check(user_with_block, [torch.randn(3) for _ in range(3)])
    r = report(cf)
    assert r["break_count"] == 1
    assert [e["kind"] for e in r["cache_entries"]] == ["eager"]
    assert r["eager_calls"] >= 1
    return r


def try_break():
    """A break inside a try block goes on in the function's own frame, with a note."""
    cf = check(catches, [torch.randn(3) for _ in range(3)])
    r = report(cf)
    assert r["break_count"] == 1 and r["breaks"][0]["reason_id"] == "MB006"
    assert [e["kind"] for e in r["cache_entries"]] == ["graph"]
    assert any("inside a try block" in n for n in r["notes"])
    return r


class Holder:
    pass


def writes_attr_and_appends(h, log, x):
    h.last = x * 2
    log.append(x.sum())
    return x + 1


def attribute_write_and_append():
    calls = [(Holder(), [], torch.randn(3)) for _ in range(3)]
    cf = check(writes_attr_and_appends, calls)
    r = report(cf)
    assert r["graph_count"] == 1 and r["break_count"] == 0
    edges = r["cache_entries"][0]["refgraph"]["edges"]
    assert edges, "the attribute write and the append should appear as RefGraph edges"
    return r


def fullgraph_after_error():
    cf = magpy.compile(uses_item, fullgraph=True)
    with pytest.raises(magpy.GraphBreakError):
        cf(torch.randn(3))
    r = report(cf)
    assert r["fullgraph"] is True
    assert r["break_count"] >= 1 and r["graph_count"] == 0
    return r


def cache_limit():
    def f(x):
        return x + 1

    cf = check(f, [torch.randn(n) for n in range(1, 12)], dynamic=False)
    r = report(cf)
    assert len(r["cache_entries"]) == 8 and r["eager_calls"] == 3
    # the limit is reported as a break with no source location
    assert any(b["filename"] == "" for b in r["breaks"])
    return r


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


def objects_and_functions_made_inside():
    """Refgraph nodes of an object of a user class and a lambda, both made in the call."""
    def f(x):
        p = Pair(x, 2)
        scale = lambda t: t * p.b  # noqa: E731
        return [scale(t) for t in iter((p.a, x + 1))], {"p": p}

    cf = check(f, [torch.randn(2) for _ in range(3)])
    r = report(cf)
    kinds = {n["kind"] for e in r["cache_entries"] for n in e["refgraph"]["nodes"]}
    assert {"object", "function"} <= kinds, sorted(kinds)
    return r


def gate(h):
    if h.sum() > 0:
        return h * 2
    return h


def through_gate(x):
    return gate(x.sin()) + 1


def callee_compiled_on_its_own():
    """A callee that breaks inside runs as a compiled callable of its own: its report nests."""
    cf = check(through_gate, [torch.full((3,), v) for v in (1.0, -1.0, 2.0, -2.0, 1.0)])
    r = report(cf)
    assert [c["name"] for c in r["callees"]] == ["gate"]
    assert r["callees"][0]["graph_count"] >= 2 and r["callees"][0]["breaks"]
    return r


SHAPES = {
    "callee_compiled_on_its_own": callee_compiled_on_its_own,
    "objects_and_functions_made_inside": objects_and_functions_made_inside,
    "plain_tensor_fn_with_recompile": plain_tensor_fn,
    "module_with_sequential": module_with_sequential,
    "graph_break": graph_break,
    "eager_break": eager_break,
    "try_break": try_break,
    "attribute_write_and_append": attribute_write_and_append,
    "fullgraph_after_error": fullgraph_after_error,
    "cache_limit": cache_limit,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_real_report_matches_schema(shape):
    r = SHAPES[shape]()
    assert_valid(r)
    assert_consistent(r)


def test_report_of_uncalled_function_matches_schema():
    cf = magpy.compile(lambda x: x * 2)
    r = report(cf)
    assert_valid(r)
    assert_consistent(r)
    assert r["calls"] == 0 and r["cache_entries"] == [] and r["graphs"] == []


# [SECTION] the schema rejects what the engine never emits --------------------------------------

@pytest.fixture
def good_report():
    r = eager_break()
    r2 = plain_tensor_fn()
    # one report with a graph entry, an eager entry and a break, so every part can be broken
    r["cache_entries"] += r2["cache_entries"]
    r["graphs"] += r2["graphs"]
    r["graph_count"] = len(r["graphs"])
    assert_valid(r)
    return r


def _graph_entry(r):
    return next(e for e in r["cache_entries"] if e["kind"] == "graph")


def _eager_entry(r):
    return next(e for e in r["cache_entries"] if e["kind"] == "eager")


BAD = {
    "unknown_top_level_key": lambda r: r.update(extra=1),
    "missing_top_level_key": lambda r: r.pop("cache_entries"),
    "callee_not_a_report": lambda r: r.update(callees=[{"name": "gate"}]),
    "calls_as_string": lambda r: r.update(calls="3"),
    "negative_count": lambda r: r.update(cache_hits=-1),
    "fullgraph_as_int": lambda r: r.update(fullgraph=0),
    "other_schema_version": lambda r: r.update(schema_version=r["schema_version"] + 1),
    "unknown_timing": lambda r: r["timings_ns"].update(overhead=1),
    "break_without_hint": lambda r: r["breaks"][0].pop("hint"),
    "break_lineno_as_string": lambda r: r["breaks"][0].update(lineno="3"),
    "unknown_entry_kind": lambda r: _graph_entry(r).update(kind="compiled"),
    "unknown_entry_key": lambda r: _graph_entry(r).update(plan="..."),
    "graph_entry_without_replay": lambda r: _graph_entry(r).pop("replay_python"),
    "eager_entry_with_replay": lambda r: _eager_entry(r).update(replay_python="def f(): pass"),
    "guard_not_a_string": lambda r: _graph_entry(r)["guards"].append(1),
    "unknown_node_kind": lambda r: _graph_entry(r)["refgraph"]["nodes"][0].update(kind="blob"),
    "unknown_node_scope": lambda r: _graph_entry(r)["refgraph"]["nodes"][0].update(scope="x"),
    "edge_without_label": lambda r: _graph_entry(r)["refgraph"]["edges"].append(
        {"src": 1, "dst": 1}),
    "op_with_unknown_step_kind": lambda r: r["graphs"][0]["ops"][0].update(kind=12),
    "op_with_extra_key": lambda r: r["graphs"][0]["ops"][0].update(args=[]),
    "graph_without_ops": lambda r: r["graphs"][0].pop("ops"),
}


@pytest.mark.parametrize("how", sorted(BAD))
def test_schema_rejects_malformed_report(good_report, how):
    bad = copy.deepcopy(good_report)
    BAD[how](bad)
    assert schema_errors(bad), f"the schema accepted a report with {how}"
