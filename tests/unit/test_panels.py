"""The notebook panels' run loop (reliableq/lab/panels.py), with stand-in scenarios that wait on events
so every state is reached on purpose: the live status line, Stop, and a failure said in one line; and the
prediction that holds back the results of its runs until it is answered."""

from __future__ import annotations

import asyncio
import html
import json
import os
import signal
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import nbformat
import pandas as pd
import pytest
from IPython.core.displaypub import CapturingDisplayPublisher
from IPython.core.getipython import get_ipython
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.pylabtools import select_figure_formats
from IPython.display import display
from traitlets.config import Config

import reliableq_stages
from reliableq.config import Mechanisms
from reliableq.lab.exercises import backoff
from reliableq.lab.exercises.checker import Outcome
from reliableq.lab.exercises.panel import ExercisePanel
from reliableq.lab.exercises.workspace import Workspace
from reliableq.lab.experiment import Prediction
from reliableq.lab.panels import ANSWER_FIRST, RUN_FIRST, STAGE_DEFAULT, WIDGET_VIEW, ScenarioPanel, SelfCheck
from reliableq.lab.places import WORKSPACE_VARIABLE
from reliableq.lab.resave import without_live_widgets
from reliableq.lab.scenario import ScenarioParams
from reliableq.lab.waiting import wait_until


class WaitingStage:
    """A stage whose scenario waits (through the one wait helper) for `release`, then fails or hangs."""
    NAME, MECHANISM, FAILURE, INVARIANT = "waiting", None, "nothing happens", "none"
    OWN_KNOBS = ("crash_point",)

    def __init__(self, timeout: float = 30.0) -> None:
        self.release = asyncio.Event()
        self.timeout = timeout
        self.params: ScenarioParams | None = None

    def mechanisms(self, on: bool) -> Mechanisms:
        return Mechanisms.all_off()

    async def scenario(self, on: bool = True, params: ScenarioParams = ScenarioParams()):
        self.params = params
        await wait_until(self.release.is_set, self.timeout, "the release of the stand-in", interval=0.01)
        raise RuntimeError("the stand-in has no result to show")


async def status_says(panel: ScenarioPanel, text: str) -> None:
    await wait_until(lambda: text in panel.status.value, 5, f"the status line to say {text!r}", interval=0.01)


async def test_a_running_panel_says_what_it_waits_for_and_for_how_long():
    """While a run waits, the status line names the run, its elapsed seconds and the wait with its deadline;
    Run is disabled and Stop enabled until it ends."""
    stage = WaitingStage()
    panel = ScenarioPanel(stage)
    run = panel.start()
    await status_says(panel, "waiting for the release of the stand-in")
    assert "running stage waiting with" in panel.status.value and "of at most 30 s" in panel.status.value
    assert panel.button.disabled and not panel.stop_button.disabled
    stage.release.set()
    with pytest.raises(RuntimeError):
        await run
    assert not panel.button.disabled and panel.stop_button.disabled


async def test_stop_ends_the_run_and_says_so():
    """Stop cancels the scenario (its system is torn down as after any run) and the panel can run again."""
    panel = ScenarioPanel(WaitingStage())
    run = panel.start()
    await status_says(panel, "waiting for")
    panel.stop()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert "stopped after" in panel.status.value
    assert not panel.button.disabled and panel.stop_button.disabled


async def test_the_kernels_interrupt_stops_a_run_in_an_idle_kernel_and_leaves_a_running_cells_alone():
    """ipykernel ignores SIGINT while idle, and a panel runs in an idle kernel's background: the interrupt
    (JupyterLab's ■, a real SIGINT here) stops the run as Stop does, and the idle handler is put back. With
    another handler in place (a cell running, which ■ must interrupt), the panel leaves it alone."""
    kept = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as ipykernel leaves it between cells
        panel = ScenarioPanel(WaitingStage())
        run = panel.start()
        await status_says(panel, "waiting for")
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(asyncio.CancelledError):
            await run
        assert "stopped after" in panel.status.value and not panel.button.disabled
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN

        signal.signal(signal.SIGINT, signal.default_int_handler)  # as ipykernel sets it while a cell runs
        stage = WaitingStage()
        second = ScenarioPanel(stage)
        run = second.start()
        await status_says(second, "waiting for")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        stage.release.set()
        with pytest.raises(RuntimeError):
            await run
    finally:
        signal.signal(signal.SIGINT, kept)


async def test_a_timeout_says_how_long_the_run_really_took_and_what_it_waited_for():
    """One line: the run, the time it ran, and the wait's own words; no traceback in the panel."""
    panel = ScenarioPanel(WaitingStage(timeout=0.1))
    with pytest.raises(TimeoutError):
        await panel.run()
    assert "gave up after 0 s: timed out after 0.1s waiting for the release of the stand-in" in panel.status.value
    assert panel.output.outputs == ()


async def test_the_button_path_reports_in_the_panel_only():
    """A run started by the button that fails leaves its error in the status line, not in the event loop's
    'exception never retrieved' log."""
    panel = ScenarioPanel(WaitingStage(timeout=0.05))
    run = panel.start()
    await status_says(panel, "gave up")
    assert run.done() and isinstance(run.exception(), TimeoutError)


def test_the_crash_point_dropdown_names_the_stage_default():
    """The default crash point is shown by name (a None value showed an empty box) and means 'none given'."""
    panel = ScenarioPanel(WaitingStage())
    assert panel.crash_point.value == STAGE_DEFAULT and panel.params().crash_point is None
    panel.crash_point.value = "after_claim_before_effect"
    assert panel.params().crash_point == "after_claim_before_effect"


def test_knobs_a_stage_does_not_read_are_greyed_out_and_say_so():
    """A panel disables the stage-specific knobs its stage ignores, and names them."""
    panel = ScenarioPanel(WaitingStage())
    assert not panel.crash_point.disabled and panel.failure_rate.disabled
    assert "failure rate: not used by this stage" in panel.widget.children[1].children[1].children[-1].value


async def test_a_long_failure_keeps_one_line_in_the_status_and_folds_the_rest():
    """A timeout's report of what was stuck goes under the status line, folded, not into it."""
    class StuckStage(WaitingStage):
        async def scenario(self, on=True, params=ScenarioParams()):
            raise TimeoutError("timed out after 20s waiting for 4 job(s)\nstuck jobs: job-1 RUNNING")

    panel = ScenarioPanel(StuckStage())
    with pytest.raises(TimeoutError):
        await panel.run()
    assert panel.status.value.endswith("timed out after 20s waiting for 4 job(s)</div>")
    (folded,) = panel.output.outputs
    assert "<summary>what was stuck</summary>" in folded["data"]["text/html"]
    assert "stuck jobs: job-1 RUNNING" in folded["data"]["text/html"]


def test_a_panel_carries_a_hidden_notice_that_the_page_shows_once_the_kernel_is_gone():
    """The kernel cannot say it is gone; the page's own marks of a restarted or dead kernel show the notice
    (the browser test sees it after a shutdown)."""
    notice = ScenarioPanel(WaitingStage()).widget.children[3].value
    assert ".jupyter-widgets-disconnected .reliableq-kernel-gone," in notice and "data-status=\"dead\"" in notice
    assert "kernel is gone" in notice


def test_the_lab_keeps_widget_messages_off_kernel_subshells_by_default():
    """The installed JupyterLab default that keeps a tick ahead of the click sent after it (RunPanel.start
    says why) names a real setting and one of its allowed values."""
    share = Path(sys.prefix) / "share" / "jupyter" / "lab"
    overrides = json.loads((share / "settings" / "overrides.d" / "reliableq.json").read_text())
    schema = json.loads((share / "schemas/@jupyterlab/apputils-extension/kernels-settings.json").read_text())
    setting = schema["properties"]["commsOverSubshells"]
    value = overrides["@jupyterlab/apputils-extension:kernels-settings"]["commsOverSubshells"]
    assert value == "disabled" and value in [choice["const"] for choice in setting["oneOf"]]


def test_the_lab_asks_no_learner_about_jupyter_news():
    """A fresh JupyterLab asks, over every page's bottom right, whether to fetch news: never, in a workshop."""
    share = Path(sys.prefix) / "share" / "jupyter" / "lab"
    overrides = json.loads((share / "settings" / "overrides.d" / "reliableq.json").read_text())
    schema = json.loads((share / "schemas/@jupyterlab/apputils-extension/notification.json").read_text())
    value = overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"]
    assert value == "false" and value in [choice["const"] for choice in schema["properties"]["fetchNews"]["oneOf"]]


# -- SelfCheck: the results of the runs it asks about, held until it is answered --

PREDICTION = Prediction("How many charges?", ["1", "2"], "2", "The retry sent no key.")


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """An IPython shell as in a kernel, its display publisher keeping what cells display, figures drawn as
    png as `%matplotlib inline` sets them."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=config)
    shell.display_pub = CapturingDisplayPublisher()
    select_figure_formats(shell, {"png"})
    yield shell
    InteractiveShell.clear_instance()


def run_gated_cell(check: SelfCheck) -> None:
    """What a notebook's result cell does through its prediction: print the report, log (a logger without a
    handler writes to sys.stderr, as the lab's do in a kernel), display a table, draw a chart."""
    with check.hidden_until_answered():
        print("The guarantee broke.")
        print("worker-1: finalize refused", file=sys.stderr)
        display(pd.DataFrame({"job": ["job-1"], "F": [2]}))
        plt.subplots()


def shown(held) -> list[str]:
    return [output.get("name") or next(key for key in output["data"] if key != "text/plain")
            for output in held.output.outputs]


def test_a_result_is_held_until_the_prediction_is_answered(shell, capsys):
    """Before an answer the cell shows one line saying to answer first; the report, the log line, the table
    and the figure are held in the kernel, and none reaches the cell or pyplot's queue for the inline backend."""
    check = SelfCheck(PREDICTION)
    open_before = plt.get_fignums()  # another test's figures, which the held cell must leave alone
    run_gated_cell(check)
    (cell_output,) = shell.display_pub.outputs
    assert cell_output["data"][WIDGET_VIEW]["model_id"] == check.held[0].widget.model_id
    assert ANSWER_FIRST in check.held[0].widget.children[0].value
    assert check.held[0].output.outputs == ()
    assert [output.get("name") or "display" for output in check.held[0].outputs] == ["stdout", "stderr", "display",
                                                                                     "display"]
    assert capsys.readouterr() == ("", "") and plt.get_fignums() == open_before


@pytest.mark.parametrize("pick", ["1", "2"], ids=["wrong", "right"])
def test_check_with_an_answer_right_or_wrong_shows_every_held_result(shell, pick):
    check = SelfCheck(PREDICTION)
    run_gated_cell(check)
    run_gated_cell(check)
    check.choice.value = pick
    assert check.check() is (pick == "2")
    for held in check.held:
        assert held.widget.children == (held.output,)  # the line saying to answer first is gone
        assert shown(held) == ["stdout", "stderr", "text/html", "image/png"]
        assert held.output.outputs[0]["text"] == "The guarantee broke.\n"


def test_an_answer_given_while_a_held_cell_still_runs_is_taken(shell):
    """Run All, and the learner answers while a held cell is still running: the kernel handles the click
    then, naming its message to the shell's publisher (ipykernel's set_parent); the answer counts and the
    cell's result, recorded meanwhile, is shown once it ends."""
    check = SelfCheck(PREDICTION)
    with check.hidden_until_answered():
        print("before the answer")
        get_ipython().display_pub.set_parent({"header": {"msg_type": "comm_msg"}})  # what ipykernel does
        check.choice.value = "2"
        assert check.check() is True
        print("after it")
    assert "".join(output["text"] for output in check.held[0].output.outputs) == "before the answer\nafter it\n"


def test_check_without_a_choice_shows_nothing(shell):
    check = SelfCheck(PREDICTION)
    run_gated_cell(check)
    assert check.check() is False and check.feedback.value == "Pick an answer first."
    assert check.held[0].output.outputs == () and ANSWER_FIRST in check.held[0].widget.children[0].value


def test_a_cell_run_after_the_answer_shows_its_result_at_once(shell):
    check = SelfCheck(PREDICTION)
    check.choice.value = "1"
    check.check()
    run_gated_cell(check)
    assert shown(check.held[0]) == ["stdout", "stderr", "text/html", "image/png"]


def test_a_failing_cell_gives_the_cell_its_output_back(shell):
    """The cell's own streams and display are back after an error, which the cell shows as usual."""
    check = SelfCheck(PREDICTION)
    streams, publisher = (sys.stdout, sys.stderr), shell.display_pub
    with pytest.raises(RuntimeError), check.hidden_until_answered():
        print("half a report")
        raise RuntimeError("the run gave up")
    assert (sys.stdout, sys.stderr) == streams and shell.display_pub is publisher
    assert check.held[0].outputs == [{"output_type": "stream", "name": "stdout", "text": "half a report\n"}]


def test_a_saved_notebook_shows_the_line_saying_to_answer_first(shell):
    """What a notebook keeps of a held result once re-saved (or opened before it is run): the picture, the
    same line as the live cell before an answer; never the result."""
    check = SelfCheck(PREDICTION)
    run_gated_cell(check)
    (cell_output,) = shell.display_pub.outputs
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("display_data", cell_output["data"])])])
    (saved,) = without_live_widgets(notebook).cells[0].outputs
    assert saved["data"] == {"text/html": f'<div class="reliableq-picture"><i>{ANSWER_FIRST}</i></div>',
                             "text/plain": ANSWER_FIRST}


# -- ExercisePanel: the learner's file, Hint, Reset, Solution; no database (broken code never reaches one) --

def exercise_panel(tmp_path: Path) -> ExercisePanel:
    return ExercisePanel(backoff.EXERCISE, tmp_path / "workspace")


def test_an_exercise_panels_status_names_the_file_from_the_kernels_folder(tmp_path, monkeypatch):
    """The status line is saved with the notebook: beside the file (the kernel runs in the workspace), it
    names the file alone, never the machine's folders."""
    panel = exercise_panel(tmp_path)
    monkeypatch.chdir(tmp_path / "workspace")
    assert panel.describe() == "the check of backoff (backoff.py)"


def test_an_exercise_panel_writes_the_starter_once_and_never_over_the_learners_file(tmp_path):
    panel = exercise_panel(tmp_path)
    assert panel.path.read_text() == backoff.EXERCISE.starter
    panel.path.write_text("my work")
    assert exercise_panel(tmp_path).path.read_text() == "my work"


def test_an_exercise_panel_uses_the_one_workspace_and_links_the_file_relative_to_the_notebook(tmp_path,
                                                                                             monkeypatch):
    workspace = tmp_path / "room" / "ann"
    workspace.parent.mkdir()
    monkeypatch.setenv(WORKSPACE_VARIABLE, str(workspace))  # what the CLI uses too
    monkeypatch.chdir(workspace.parent)  # a kernel runs in its notebook's folder
    panel = ExercisePanel(backoff.EXERCISE)
    assert (workspace / "backoff.py").read_text() == backoff.EXERCISE.starter
    (file_line,) = panel.widget.children[0].children[1].outputs
    assert '<a href="ann/backoff.py" target="_blank"><code>backoff.py</code></a>' in file_line["data"]["text/html"]
    # The saved picture links from the learner's copy of the notebook, beside the file.
    assert '<a href="backoff.py" target="_blank"><code>backoff.py</code></a>' in panel.picture()
    assert RUN_FIRST in panel.picture() and "▶ Check" in panel.picture()
    assert panel.button.description == "Check" and "Press Check." in panel.status.value
    assert "Your progress: 0 of 10 passed" in panel.progress_line.value and "07·" in panel.picture()


def test_the_panels_progress_line_shows_what_the_cli_recorded(tmp_path):
    Workspace(tmp_path).record(backoff.EXERCISE, state="passed")
    assert "1 of 10 passed" in ExercisePanel(backoff.EXERCISE, tmp_path).progress_line.value


def test_a_check_from_a_terminal_shows_in_an_open_panel_at_its_next_button(tmp_path):
    """The panel was open before the terminal's check: Hint, Reset or Solution bring its line and its
    Solution button up to what the workspace records."""
    panel = ExercisePanel(backoff.EXERCISE, tmp_path)
    assert "0 of 10 passed" in panel.progress_line.value and panel.solution_button.disabled
    Workspace(tmp_path).record(backoff.EXERCISE, state="passed")  # what `reliableq exercise check` records
    panel.hint()
    assert "1 of 10 passed" in panel.progress_line.value and not panel.solution_button.disabled
    Workspace(tmp_path).record(backoff.EXERCISE, state="failing")
    assert panel.solution() != backoff.EXERCISE.reference and "0 of 10 passed" in panel.progress_line.value


def test_hints_come_one_at_a_time_and_reset_says_where_the_learners_version_went(tmp_path):
    panel = exercise_panel(tmp_path)
    assert panel.hint().endswith(f"\nHint 1 of {len(backoff.EXERCISE.hints)}: {backoff.EXERCISE.hints[0]}")
    assert "\nHint 2 of" in panel.hint()
    panel.path.write_text("my work")
    said = panel.reset()
    backup = Path(said.split("your version is in ")[1].rstrip("."))
    assert backup.read_text() == "my work" and panel.path.read_text() == backoff.EXERCISE.starter
    assert html.escape(said) == panel.message.value


def test_the_solution_shows_only_after_giving_up_or_a_pass(tmp_path):
    panel = exercise_panel(tmp_path)
    assert panel.solution_button.disabled
    assert panel.solution() == "The solution shows after a pass, or after Give up."
    assert panel.give_up() == backoff.EXERCISE.reference and not panel.solution_button.disabled
    assert "Why it works:" in panel.message.value
    Workspace(tmp_path / "passed").record(backoff.EXERCISE, state="passed")
    assert not ExercisePanel(backoff.EXERCISE, tmp_path / "passed").solution_button.disabled


async def test_broken_code_is_said_in_one_line_and_recorded_as_failing(tmp_path):
    """A syntax error is the checker's one line in the panel (no traceback), and the progress says failing."""
    panel = exercise_panel(tmp_path)
    panel.path.write_text("def retry_delay(attempt, base, cap, rng)\n    return 0\n")
    saved = time.time() - 600
    os.utime(panel.path, (saved, saved))
    result = await panel.run()
    assert result.outcome is Outcome.FAILED and result.run is None
    (shown,) = panel.output.outputs
    verdict, graded = shown["text"].splitlines()
    assert verdict == "✗ Your code could not be used: backoff.py, line 1: expected ':'"
    # When it was saved, as the check saw it: a line kept in the notebook that stays true when reread.
    assert graded == (f"Graded backoff.py as saved at {time.strftime('%H:%M:%S', time.localtime(saved))}, 10 min "
                      "before this check; unsaved edits in the editor are not in it.")
    assert "Traceback" not in shown["text"] and "done in" in panel.status.value
    assert Workspace(tmp_path / "workspace").state(backoff.EXERCISE) == "failing"


async def test_a_missing_file_is_said_in_the_status_line(tmp_path):
    panel = exercise_panel(tmp_path)
    panel.path.unlink()
    with pytest.raises(FileNotFoundError):
        await panel.run()
    assert "is not there: press Reset to write the starter" in panel.status.value


def test_a_stage_panel_names_its_run_as_the_stage_does_until_another_switch_is_changed():
    """With the stage's switches (its defaults) a panel's run is the stage's own ("semaphore on"), not the
    later stages' mechanisms it leaves off; another switch changed, the panel names what is off."""
    panel = ScenarioPanel(reliableq_stages.get("semaphore"))
    assert panel.describe() == "stage semaphore with semaphore on"
    panel.switches["semaphore"].value = False
    assert panel.describe() == "stage semaphore with semaphore off"
    panel.switches["semaphore"].value, panel.switches["fencing"].value = True, False
    assert panel.describe() == "stage semaphore with off: fencing, sync_standby, fairness"
