"""notebooks/analysis.ipynb executes top to bottom (nbclient, the venv's python3 kernel) on a real audit."""

from __future__ import annotations

import json
import sys
from pathlib import Path


from tests.test_audit import build_audit_db

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "analysis.ipynb"


def test_notebook_outputs_are_cleared_in_git():
    nb = json.loads(NOTEBOOK.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


def test_kernel_is_this_venv():
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    exe = spec.argv[0]
    # "python" in a kernelspec resolves on PATH; an absolute path must be this interpreter's venv
    assert exe in ("python", "python3", sys.executable) or Path(exe).resolve().parent == Path(sys.executable).parent


def test_notebook_runs_against_a_real_audit(tmp_path_factory, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    db, summary = build_audit_db(tmp_path_factory)
    monkeypatch.setenv("ACCEPTSCOPE_NOTEBOOK_DB", str(db))
    # the kernel must import this checkout's packages and use this interpreter
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{__import__('os').environ.get('PATH', '')}")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on any failing cell
    out = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                    if o.output_type == "stream")
    assert f"audit group: {summary['audit_group']}" in out
    assert "parity ok=True" in out
    # figures were produced (plotly mime bundles)
    n_figs = sum("application/vnd.plotly.v1+json" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs)
    assert n_figs >= 5
