"""Re-save notebooks as the repository keeps them: run top to bottom in a fresh kernel, then each widget
view dropped where a static picture of it stands beside it, and no widget state kept.

A saved widget view without its kernel is a dead control (JupyterLab draws it disconnected, or "model
not found"); its picture (reliableq/lab/panels.py) says to run the notebook instead. nbval compares the
pictures and text with a fresh run and ignores widget views, so the kept outputs are still verified.

    python -m reliableq.lab.resave notebooks/05_fencing.ipynb [...]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

from reliableq.lab.places import BENCH_RESULTS_VARIABLE, WORKSPACE_VARIABLE, reference_bench_results

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
KERNEL = "python3"
CELL_TIMEOUT_SECONDS = 600


def without_live_widgets(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop every widget view that has a picture beside it, and the notebook's saved widget state."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data and "text/html" in data:
                del data[WIDGET_VIEW]
    notebook.metadata.pop("widgets", None)
    return notebook


def kernelspec_as_jupyterlab_writes_it() -> dict[str, str]:
    """The kernelspec metadata JupyterLab writes into a notebook once its kernel connects. A notebook saved
    with any other (nbclient keeps whatever the file had: "Python 3" where ipykernel says "Python 3
    (ipykernel)") is changed by opening it, and JupyterLab marks it modified before the learner did a thing."""
    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    return {"display_name": spec.display_name, "language": spec.language, "name": KERNEL}


def resave(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=CELL_TIMEOUT_SECONDS, kernel_name=KERNEL,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    notebook.metadata.kernelspec = kernelspec_as_jupyterlab_writes_it()
    nbformat.write(without_live_widgets(notebook), path)


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python -m reliableq.lab.resave NOTEBOOK.ipynb [...]", file=sys.stderr)
        return 2
    # The kernels (which inherit this environment) write the exercise starters into a workspace of their
    # own, and the saved progress lines show a learner who has not begun, whatever the developer's is.
    os.environ[WORKSPACE_VARIABLE] = tempfile.mkdtemp(prefix="reliableq-resave-workspace-")
    # Notebook 13 is saved showing the benchmark results shipped with it, never the developer's own run.
    os.environ[BENCH_RESULTS_VARIABLE] = str(reference_bench_results())
    for name in paths:
        resave(Path(name))
        print(f"re-saved {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
