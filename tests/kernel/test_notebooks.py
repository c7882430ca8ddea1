"""Every notebook under notebooks/ runs end to end with nbclient against the magpy kernel."""

import glob
import os

import nbclient
import nbformat
import pytest

import kernel_env

NOTEBOOKS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "notebooks",
                                          "*.ipynb")))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=kernel_env.KERNEL_NAME, timeout=300,
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is not None


def test_quickstart_shows_magpy_views():
    path = [p for p in NOTEBOOKS if p.endswith("quickstart.ipynb")]
    assert path, "notebooks/quickstart.ipynb is missing"
    nb = nbformat.read(path[0], as_version=4)
    nbclient.NotebookClient(nb, kernel_name=kernel_env.KERNEL_NAME, timeout=300).execute()
    magpy_cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%magpy")]
    assert len(magpy_cells) == 2
    for cell in magpy_cells:
        kinds = {m for o in cell.outputs if o.output_type == "display_data" for m in o.data}
        results = [o for o in cell.outputs if o.output_type == "execute_result"]
        assert results, cell.outputs
        # Rich views with a text fallback (the kernel's custom MIME types survive nbformat).
        assert any(m.startswith("application/vnd.magpy.") for m in kinds), kinds
        assert "text/html" in kinds
    assert magpy_cells[0].outputs[-1].data == magpy_cells[1].outputs[-1].data
