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


@pytest.mark.timeout(120)
def test_a_notebook_opened_before_it_is_run_shows_pictures_not_dead_widgets(open_notebook):
    """Before any cell runs, the prediction and the panel are static pictures saying what to do; there is
    no widget view to draw disconnected, and nothing says 'Error displaying widget'."""
    notebook = open_notebook("05_fencing.ipynb")
    expect(notebook.panel.get_by_text("to use this panel.")).to_have_count(1)
    expect(notebook.panel.get_by_text("to check your prediction.")).to_have_count(1)
    expect(notebook.panel.locator(".jupyter-widgets")).to_have_count(0)
    expect(notebook.panel).not_to_contain_text("Error displaying widget")


@pytest.mark.timeout(300)
def test_a_learner_predicts_then_runs_the_panel_twice_and_sees_one_live_result(open_notebook):
    """After Run All: a wrong prediction is answered with the right one and why; a run shows its status
    line while it goes and 'done' after; a second run replaces the first, so one verdict and one table
    are shown, right under the buttons."""
    notebook = open_notebook("05_fencing.ipynb")
    notebook.run_all_cells(timeout_seconds=120, expected_stderr=[REFUSED_STALE_FINALIZE])
    check = notebook.code_cell("SelfCheck(")
    check.get_by_role("radio").first.check()
    check.get_by_role("button", name="Check").click()
    expect(check).to_contain_text("Not quite: the answer is 2: both finalizes succeed and both are recorded.")

    panel = notebook.code_cell("ScenarioPanel(")
    run = panel.get_by_role("button", name="Run scenario")
    result = panel.locator(".widget-output")
    for _ in range(2):
        run.click()
        expect(panel).to_contain_text("⏳ running stage fencing with", timeout=30_000)
        expect(panel).to_contain_text("done in", timeout=60_000)
    expect(result.get_by_text("Stage 05 fencing with fencing on")).to_have_count(1)
    expect(result.locator("table")).to_have_count(1)
