"""The lab's notebooks in JupyterLab in headless Chromium, as a learner runs them: every cell runs without an
error output, and a stage's panel answers a click with a result."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed: pip install -e '.[dev]'")

from playwright.sync_api import expect  # noqa: E402  (only once playwright is known to be there)

pytestmark = pytest.mark.slow

# Worker-1's refused stale finalizes: 05 shows them on purpose (its "fencing on" run), as log lines that
# name the job by its id or by its label.
REFUSED_STALE_FINALIZE = r"worker worker-1: finalize \(succeed\) of .+ refused: its lease was lost"


@pytest.mark.timeout(180)
def test_start_here_runs_every_cell_without_an_error(open_notebook):
    open_notebook("00_start_here.ipynb").run_all_cells(timeout_seconds=120)


@pytest.mark.timeout(240)
def test_fencing_runs_every_cell_and_its_panel_runs_what_was_ticked(open_notebook):
    """With idempotency ticked as well as fencing, the panel's run reports the guarantee held: the click
    reached the kernel with the switches as shown (the notebook's own runs, idempotency off, broke it)."""
    notebook = open_notebook("05_fencing.ipynb")
    notebook.run_all_cells(timeout_seconds=120, expected_stderr=[REFUSED_STALE_FINALIZE])
    panel = notebook.code_cell("ScenarioPanel(")
    expect(panel.get_by_role("checkbox", name="fencing", exact=True)).to_be_checked()
    panel.get_by_role("checkbox", name="idempotency", exact=True).check()
    panel.get_by_role("button", name="Run scenario").click()
    result = panel.locator(".widget-output")
    expect(result).to_contain_text("The guarantee held.", timeout=60_000)
    expect(result.locator("table")).to_contain_text("job-1")


@pytest.mark.timeout(300)
def test_chaos_runs_every_cell_without_an_error(open_notebook):
    open_notebook("10_chaos.ipynb").run_all_cells(timeout_seconds=240)
