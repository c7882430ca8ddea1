"""Every notebook under notebooks/ runs end to end with nbclient against the magpy kernel; the
main job's notebook step (scripts/run-notebook.sh) leaves the executed notebook and its HTML."""

import glob
import os
import subprocess

import nbclient
import nbformat
import pytest

import kernel_env

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
QUICKSTART = os.path.join(ROOT, "notebooks", "quickstart.ipynb")
VIEWS = ["application/vnd.magpy.%s+json" % kind for kind in
         ("progress", "graphs", "refgraph", "guards", "breaks", "plan", "timings")]


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


def magpy_mimes(cell):
    return [m for o in cell.outputs if o.output_type == "display_data" for m in o.data
            if m.startswith("application/vnd.magpy.")]


def check_quickstart(nb):
    """The two %%magpy cells show the live view and the six views, each with HTML and text
    fallbacks, and the same value; %magpy explain shows the six views again."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    magpy_cells = [c for c in code if c.source.startswith("%%magpy")]
    assert len(magpy_cells) == 2
    for cell in magpy_cells:
        assert magpy_mimes(cell) == VIEWS, magpy_mimes(cell)
        for o in cell.outputs:
            if o.output_type == "display_data":
                assert {"text/html", "text/plain"} <= set(o.data), set(o.data)
        assert [o for o in cell.outputs if o.output_type == "execute_result"], cell.outputs
    assert magpy_cells[0].outputs[-1].data == magpy_cells[1].outputs[-1].data
    (explain,) = [c for c in code if c.source.strip() == "%magpy explain"]
    assert magpy_mimes(explain) == VIEWS[1:]


def test_quickstart_shows_magpy_views():
    nb = nbformat.read(QUICKSTART, as_version=4)
    nbclient.NotebookClient(nb, kernel_name=kernel_env.KERNEL_NAME, timeout=300,
                            resources={"metadata": {"path": ROOT}}).execute()
    check_quickstart(nb)


def test_main_job_notebook_step_leaves_the_executed_notebook_and_html(tmp_path):
    """scripts/run-notebook.sh, as scripts/main-job.sh runs it (here with the kernel of this
    build, through the temporary kernelspec named magpy)."""
    out = tmp_path / "notebooks"
    done = subprocess.run([os.path.join(ROOT, "scripts", "run-notebook.sh"), QUICKSTART,
                           str(out), kernel_env.KERNEL_NAME], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HTML at %s" % (out / "quickstart.html") in done.stdout
    nb = nbformat.read(str(out / "quickstart.ipynb"), as_version=4)
    check_quickstart(nb)
    page = (out / "quickstart.html").read_text()
    # nbconvert shows each view as its self-contained text/html fallback, unchanged
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for o in cell.outputs:
            if o.output_type == "display_data" and any(
                    m.startswith("application/vnd.magpy.") for m in o.data):
                assert o.data["text/html"].strip() in page, o.data["text/html"][:200]
    assert "<svg" in page  # the RefGraph, laid out by graphviz


def test_run_notebook_names_a_missing_notebook(tmp_path):
    done = subprocess.run([os.path.join(ROOT, "scripts", "run-notebook.sh"),
                           str(tmp_path / "nope.ipynb"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nope.ipynb" in done.stderr
