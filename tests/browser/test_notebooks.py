"""The lab's notebooks in JupyterLab in headless Chromium, as a learner runs them: every cell runs without an
error output, and a stage's panel answers a click with a result."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed: pip install -e '.[dev]'")

from playwright.sync_api import expect  # noqa: E402  (only once playwright is known to be there)

from reliableq.lab.exercises import fencing  # noqa: E402
from reliableq.lab.panels import ANSWER_FIRST  # noqa: E402
from reliableq.lab.places import WORKSPACE_VARIABLE  # noqa: E402

pytestmark = pytest.mark.slow

# Worker-1's refused stale finalizes: 05 shows them on purpose (its "fencing on" run, once its prediction is
# answered), as log lines that name the job by its id or by its label.
STOP_WITHIN_MS = 2_000  # the bound for Stop; measured 0.2-0.4 s in process (tests/stages/test_stop.py)
REFUSED_STALE_FINALIZE = r"worker worker-1: finalize \(succeed\) of .+ refused: its lease was lost"
HELD_RESULTS_05 = 6  # the cells of 05 whose results wait for its prediction: two runs, table, chart, two timelines


@pytest.mark.timeout(180)
def test_start_here_runs_every_cell_without_an_error(open_notebook):
    open_notebook("00_start_here.ipynb").run_all_cells(timeout_seconds=120)


@pytest.mark.timeout(300)
def test_chaos_runs_every_cell_and_its_panel_shows_only_the_run_with_the_last_choice(open_notebook):
    """After Run All, two runs of the chaos panel with different mechanisms switched off: the second report
    replaces the first, and it is the run of the mechanism chosen last."""
    notebook = open_notebook("12_chaos.ipynb")
    notebook.run_all_cells(timeout_seconds=240)
    panel = notebook.code_cell("ChaosPanel(")
    run = panel.get_by_role("button", name="Run chaos")
    result = panel.locator(".widget-output")
    for switched_off in ("idempotency", "dead"):
        panel.get_by_role("combobox").select_option(switched_off)
        run.click()
        expect(panel).to_contain_text(f"◷ running chaos with {switched_off} off", timeout=30_000)
        expect(panel).to_contain_text(f"chaos with {switched_off} off: done in", timeout=120_000)
    expect(result).to_contain_text("off: dead")
    expect(result).not_to_contain_text("off: idempotency")
    expect(result.get_by_text("invariants:")).to_have_count(1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("notebook_path, panels", [("00_start_here.ipynb", 0), ("05_fencing.ipynb", 2),
                                                   ("12_chaos.ipynb", 1)])
def test_a_notebook_opened_before_it_is_run_shows_pictures_not_dead_widgets(open_notebook, notebook_path, panels):
    """Before any cell runs, every panel and prediction is a static picture saying what to do; there is
    no widget view to draw disconnected, and nothing says 'Error displaying widget'."""
    notebook = open_notebook(notebook_path)
    expect(notebook.panel.get_by_text("to use this panel.")).to_have_count(panels)
    expect(notebook.panel.locator(".jupyter-widgets")).to_have_count(0)
    expect(notebook.panel).not_to_contain_text("Error displaying widget")
    if notebook_path == "05_fencing.ipynb":
        expect(notebook.panel.get_by_text("to check your prediction.")).to_have_count(1)
        expect(notebook.panel.get_by_text(ANSWER_FIRST)).to_have_count(HELD_RESULTS_05)


@pytest.mark.timeout(300)
def test_a_learner_predicts_runs_the_panel_with_two_settings_and_sees_only_the_last(open_notebook):
    """After Run All, nothing of the runs the prediction asks about is on the page, only the line saying to
    answer first, and Check without a pick changes nothing; a wrong prediction is answered with the right
    one and why, and every held result appears, log lines included. Stop ends a run with leases off
    (worker-1 paused for good) within 2 s of the click. The panel runs with fencing off (it breaks), then
    with fencing and idempotency ticked: each run shows its live status line, and the second result, the
    guarantee held, replaces the first right under the buttons. Once the kernel is shut down,
    the panel says so; saved and opened again, it shows what it showed, never "Error displaying widget"."""
    notebook = open_notebook("05_fencing.ipynb")
    notebook.run_all_cells(timeout_seconds=120)
    check = notebook.code_cell("SelfCheck(")
    off_run = notebook.code_cell("off = await stage.scenario(False")
    on_run = notebook.code_cell("on = await stage.scenario(True")
    expect(notebook.panel.get_by_text(ANSWER_FIRST)).to_have_count(HELD_RESULTS_05)
    expect(off_run).to_contain_text(ANSWER_FIRST)
    expect(off_run).not_to_contain_text("The guarantee broke")
    expect(off_run).not_to_contain_text("stale_finalizes_won")
    expect(notebook.code_cell("nb.plot_counts(").locator("img")).to_have_count(0)
    check.get_by_role("button", name="Check").click()
    expect(check).to_contain_text("Pick an answer first.")
    expect(off_run).to_contain_text(ANSWER_FIRST)
    expect(off_run).not_to_contain_text("The guarantee broke")

    check.get_by_role("radio").first.check()
    check.get_by_role("button", name="Check").click()
    expect(check).to_contain_text("Not quite: the answer is 2: both finalizes succeed and both are recorded.")
    expect(notebook.panel.get_by_text(ANSWER_FIRST)).to_have_count(0)
    off_run.scroll_into_view_if_needed()
    expect(off_run.get_by_text("The guarantee broke")).to_be_visible()
    expect(off_run).to_contain_text("'stale_finalizes_won': 4")
    expect(on_run).to_contain_text(re.compile(REFUSED_STALE_FINALIZE))
    expect(notebook.code_cell("nb.plot_counts(").locator("img")).to_have_count(1)

    panel = notebook.code_cell("ScenarioPanel(")
    run = panel.get_by_role("button", name="Run scenario")
    result = panel.locator(".widget-output")
    fencing = panel.get_by_role("checkbox", name="fencing", exact=True)
    # Stop, where a learner met a run that went on for a minute: leases off, worker-1 paused for good and
    # given 60 s of grace, the run waiting for a worker-2 that can never take its jobs over.
    leases = panel.get_by_role("checkbox", name="leases", exact=True)
    leases.uncheck()
    run.click()
    expect(panel).to_contain_text("waiting for", timeout=60_000)
    pressed = time.monotonic()
    panel.get_by_role("button", name="Stop").click()
    expect(panel).to_contain_text("■ stopped after", timeout=STOP_WITHIN_MS)
    print(f"05 stopped {time.monotonic() - pressed:.2f} s after Stop was clicked")
    expect(run).to_be_enabled()
    leases.check()
    fencing.uncheck()
    run.click()
    expect(panel).to_contain_text("◷ running stage fencing with", timeout=30_000)
    expect(panel).to_contain_text("done in", timeout=60_000)
    expect(result).to_contain_text("The guarantee broke")
    expect(result.locator("pre").first).to_have_css("word-break", "normal")  # wrapped at spaces, not mid-word
    fencing.check()
    panel.get_by_role("checkbox", name="idempotency", exact=True).check()
    run.click()
    expect(panel).to_contain_text("◷ running stage fencing with", timeout=30_000)
    expect(result).to_contain_text("The guarantee held.", timeout=60_000)
    expect(result).not_to_contain_text("The guarantee broke")
    expect(result.get_by_text("Stage 05 fencing with")).to_have_count(1)
    expect(result.locator("table")).to_have_count(1)
    expect(result.locator("table")).to_contain_text("job-1")

    notebook.panel.locator(".jp-Notebook").click()  # the notebook has the focus, then Ctrl+S, as a learner
    notebook.page.keyboard.press("Control+s")  # saves it (JupyterLab's autosave does the same), panels live
    expect(notebook.page.locator(".jp-mod-dirty")).to_have_count(0, timeout=30_000)

    gone = panel.get_by_text("This panel's kernel is gone")
    expect(gone).to_be_hidden()
    notebook.menu("Kernel", "Shut Down Kernel")
    expect(gone).to_be_visible(timeout=30_000)

    reopened = open_notebook("05_fencing.ipynb")
    expect(reopened.code_cell("ScenarioPanel(")).to_contain_text("The guarantee held.", timeout=30_000)
    expect(reopened.code_cell("off = await stage.scenario(False")).to_contain_text("The guarantee broke")
    expect(reopened.code_cell("SelfCheck(")).to_contain_text("Not quite: the answer is 2")
    expect(reopened.panel).not_to_contain_text("Error displaying widget")
    # Drawn from the saved state, the widgets carry no broken-link mark each: the panel's notice speaks once.
    disconnected = reopened.panel.locator(".jupyter-widgets-disconnected").first
    expect(disconnected).to_be_attached(timeout=30_000)
    assert disconnected.evaluate("e => getComputedStyle(e, '::before').display") == "none"


@pytest.mark.timeout(300)
def test_a_learner_writes_fencing_in_the_workspace_and_the_panel_passes_it(open_notebook, jupyterlab):
    """Its two cells run (05's Run All is the prediction test's), the starter's failing verdict stands in
    its cell; the reference written into the workspace's file passes when Check is pressed, with the
    run's table under the verdict, and `reliableq exercise list` then says passed; the file's link opens
    it in JupyterLab's editor."""
    notebook = open_notebook("05_fencing.ipynb")
    notebook.run_cells("starter = await check(", "ExercisePanel(", timeout_seconds=120)
    # The first forced schedule the starter breaks, naming its mistake.
    expect(notebook.code_cell("starter = await check(")).to_contain_text(
        "✗ Broken: after the same worker reclaimed a job, its old claim's renew, succeed, retry and dead")

    learners_file = jupyterlab.workspace / "fencing.sql"
    assert learners_file.read_text() == fencing.STARTER  # written by the panel when its cell ran
    learners_file.write_text(fencing.REFERENCE)
    panel = notebook.code_cell("ExercisePanel(")
    panel.get_by_role("button", name="Check").click()
    expect(panel).to_contain_text("◷ running the check of fencing", timeout=30_000)
    expect(panel).to_contain_text("step ", timeout=30_000)  # which step is running, on the status line
    result = panel.locator(".widget-output").last
    expect(result).to_contain_text("✓ fencing passed", timeout=180_000)
    expect(result.locator("table")).to_contain_text("job-1")
    expect(panel.get_by_role("button", name="Solution")).to_be_enabled()
    expect(panel).to_contain_text("Your progress: 1 of 10 passed")
    listed = subprocess.run([sys.executable, "-m", "reliableq", "exercise", "list"], capture_output=True, text=True,
                            env=os.environ | {WORKSPACE_VARIABLE: str(jupyterlab.workspace)}, check=True).stdout
    assert "05 fencing           passed" in listed

    panel.get_by_role("link", name="fencing.sql").click()
    editor = notebook.page.locator(".jp-FileEditor")
    expect(editor).to_be_visible(timeout=30_000)
    expect(editor).to_contain_text("-- name: job_renew_lease")


@pytest.mark.timeout(300)
def test_stage_10_shows_the_lost_jobs_and_the_refusals_once_answered(open_notebook):
    """Notebook 10 run as a learner runs it: after Run All its runs are held back; answered (rightly), the
    off run shows the jobs acknowledged during the cut LOST and the on run the submissions refused with
    503 and nothing lost, with no warning or error box (the pools' discarded connections are quiet)."""
    notebook = open_notebook("10_sync_standby.ipynb")
    notebook.run_all_cells(timeout_seconds=120)
    off_run = notebook.code_cell("off = await stage.scenario(False")
    on_run = notebook.code_cell("on = await stage.scenario(True")
    expect(off_run).to_contain_text(ANSWER_FIRST)
    check = notebook.code_cell("SelfCheck(")
    check.get_by_role("radio", name="None of them").check()
    check.get_by_role("button", name="Check").click()
    expect(check).to_contain_text("None of them")
    expect(off_run).to_contain_text("lost_jobs=4", timeout=60_000)
    expect(off_run).to_contain_text("job-5  LOST")
    expect(on_run).to_contain_text("refused_during_the_cut=4", timeout=60_000)
    expect(on_run).to_contain_text("lost_jobs=0")
    expect(on_run).not_to_contain_text("discarding closed connection")
    expect(notebook.panel.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']")).to_have_count(0)


@pytest.mark.timeout(300)
def test_an_answer_given_while_run_all_still_runs_shows_the_held_results(open_notebook):
    """Notebook 11 as a learner meets it: Run All, and the prediction answered as soon as it shows, while
    the held runs are still running (ipykernel handles the click then). The answer counts, and once Run All
    ends every held result is there: the off run's whole backlog ahead of B, the table of backlogs."""
    notebook = open_notebook("11_fairness.ipynb")
    notebook.start_run_all()
    check = notebook.code_cell("SelfCheck(")
    check.get_by_role("radio", name="None or one: B's job is in the first claim").check(timeout=60_000)
    check.get_by_role("button", name="Check").click()
    growth = notebook.code_cell("waits_by_backlog(")
    expect(growth.locator(".jp-InputArea-prompt")).not_to_have_text(re.compile(r"\[\d+\]:"))  # still to run
    expect(check).to_contain_text("Right", timeout=30_000)
    notebook.run_all_cells(timeout_seconds=120, started=True)
    expect(notebook.code_cell("off = await stage.scenario(False")).to_contain_text("jobs_ahead_of_b=20")
    expect(growth).to_contain_text("ahead_of_b_fifo")
    expect(notebook.panel.get_by_text(ANSWER_FIRST)).to_have_count(0)
