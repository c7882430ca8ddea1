"""`%load_ext magpy` and the first %%magpy cell magic, in a real IPython shell."""

from conftest import global_shell


def test_load_ext_and_cell_magic_replays_from_cache():
    ip = global_shell()
    ip.run_cell("import torch").raise_error()
    ip.run_cell("%load_ext magpy").raise_error()
    ip.run_cell("x = torch.ones(3); w = 2.0").raise_error()
    cell = "y = torch.relu(x) * w\ny.sum()"
    for _ in range(3):
        r = ip.run_cell(f"%%magpy --quiet\n{cell}")
        r.raise_error()
    assert float(ip.user_ns["y"].sum()) == 6.0
    ex = ip.run_cell("%magpy_explain").result
    assert ex.graph_count == 1 and ex.cache_hits == 2
    ip.run_cell("w = 3.0").raise_error()  # a global the cell read changes: recompile
    ip.run_cell(f"%%magpy --quiet\n{cell}").raise_error()
    assert float(ip.user_ns["y"].sum()) == 9.0
    ex = ip.run_cell("%magpy_explain").result
    assert any("w" in why for why in ex.recompile_reasons), ex.recompile_reasons
