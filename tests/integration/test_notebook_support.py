"""What the notebooks call (reliableq.lab.notebook), `reliableq lab`, and the saved widget state that lets
the notebooks' widgets render when opened in JupyterLab."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import httpx
import nbformat
import psutil
import pytest
from nbformat.sign import NotebookNotary

import reliableq_stages
from reliableq.lab import notebook as nb
from reliableq.lab import panels
from reliableq.lab.experiment import Prediction, compare
from reliableq.lab.places import WORKSPACE_VARIABLE
from reliableq.lab.resave import kernelspec_as_jupyterlab_writes_it, without_live_widgets
from reliableq.lab.scenario import ScenarioParams
from reliableq.lab.waiting import wait_until
from reliableq.servers import free_port

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


@pytest.mark.slow
async def test_tables_and_charts_show_the_counts_before_and_after():
    """counts_table stacks both runs; plot_counts draws one panel per run; the timeline has a lane per worker."""
    stage = reliableq_stages.get("idempotency")
    off, on = await compare(stage, ScenarioParams(seed=1, jobs=2))
    table = nb.counts_table(off, on)
    assert list(table["run"].unique()) == ["idempotency off", "idempotency on"]
    assert table.groupby("run")["C"].max().to_dict() == {"idempotency off": 2, "idempotency on": 1}
    assert len(nb.plot_counts(off, on).axes) == 2
    lanes = [t.get_text() for t in nb.plot_timeline(off).axes[0].get_yticklabels()]
    assert {"worker-1", "worker-2", "charge-service"} <= set(lanes)
    assert set(nb.events_table(off)["kind"]) >= {"claim", "charge", "crash", "lease_expired", "finalize_won"}


async def test_scenario_panel_runs_with_the_switches_a_learner_picked():
    """Unticking idempotency in the panel and pressing Run charges twice; the result is shown in the panel."""
    panel = panels.ScenarioPanel(reliableq_stages.get("idempotency"), ScenarioParams(seed=1, jobs=2))
    assert panel.switches["idempotency"].value is True
    panel.switches["idempotency"].value = False
    panel.lease.value = 0.5
    result = await panel.run()
    assert result.mechanisms.idempotency is False and result.params.lease_seconds == 0.5
    assert [row["C"] for row in result.rows()] == [2, 2]
    assert panel.output.outputs and not panel.button.disabled


@pytest.mark.slow
async def test_a_second_run_replaces_the_first_in_the_panel():
    """Run with idempotency off, then on: the panel shows the second result only, with one summary."""
    panel = panels.ScenarioPanel(reliableq_stages.get("idempotency"), ScenarioParams(seed=1, jobs=1))
    panel.switches["idempotency"].value = False
    first = await panel.run()
    panel.switches["idempotency"].value = True
    second = await panel.run()
    printed = "".join(o["text"] for o in panel.output.outputs if o["output_type"] == "stream")
    assert first.violations() and not second.violations()
    assert printed.count("Stage 06 idempotency with idempotency ") == 1 and "idempotency on" in printed
    assert len(panel.output.outputs) == len(nb.views(second))
    assert "done in" in panel.status.value


def test_self_check_says_whether_the_prediction_was_right():
    """A wrong pick shows the answer and why; the right pick says so."""
    check = panels.SelfCheck(Prediction("How many charges?", ["1", "2"], "2", "The retry sent no key."))
    check.choice.value = "1"
    assert check.check() is False and "2" in check.feedback.value
    check.choice.value = "2"
    assert check.check() is True and "Right" in check.feedback.value


def test_predictions_live_with_their_stage_not_in_the_notebook():
    """Each stage notebook asks its stage's question, and nothing a learner reads before answering (the
    cells up to the question) spells out the answer."""
    for stage, path in zip(reliableq_stages.STAGES, _notebooks()[1:12], strict=True):
        sources = ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]]
        asked = sources.index(ASKED)
        assert not [source for source in sources[:asked + 1] if stage.PREDICTION.answer in source], path.stem
    with pytest.raises(ValueError, match="not one of the options"):
        Prediction("?", ["a"], "b", "")


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


ASKED = "prediction = panels.SelfCheck(stage.PREDICTION)\nprediction"
HELD = "with prediction.hidden_until_answered():\n"


@pytest.mark.parametrize("path", _notebooks()[1:12], ids=lambda p: p.stem)
def test_a_saved_stage_notebook_shows_nothing_of_the_runs_before_its_prediction_is_answered(path):
    """From the question to the last cell it holds back, every code cell of the saved notebook (what nbval
    also compares with a fresh run) shows only the line saying to answer first; and every cell before the
    scenario panel that runs the stage or shows its results is in that stretch."""
    cells = json.loads(path.read_text())["cells"]
    sources = ["".join(cell["source"]) for cell in cells]
    asked = sources.index(ASKED)
    panel = next(i for i, source in enumerate(sources) if source.startswith("panels.ScenarioPanel("))
    held = [i for i, source in enumerate(sources) if source.startswith(HELD)]
    results = [i for i in range(asked + 1, panel)
               if cells[i]["cell_type"] == "code" and ("stage.scenario(" in sources[i] or "nb." in sources[i])]
    assert results and set(results) <= set(held) and max(held) < panel
    picture = f'<div class="reliableq-picture"><i>{html.escape(panels.ANSWER_FIRST)}</i></div>'
    for cell in cells[asked + 1:max(held) + 1]:
        if cell["cell_type"] == "code":
            assert [(output["output_type"], "".join(output.get("data", {}).get("text/html", "")))
                    for output in cell["outputs"]] == [("display_data", picture)], "".join(cell["source"])


def test_notebooks_are_in_reading_order_one_per_stage():
    """Start here, then one notebook per stage in stage order, then chaos and benchmarks."""
    names = [p.stem for p in _notebooks()]
    expected_stages = [f"{i:02d}_{s.NAME.replace('-', '_')}" for i, s in enumerate(reliableq_stages.STAGES, start=1)]
    assert names[0] == "00_start_here"
    assert names[1:12] == expected_stages
    assert names[12:] == ["12_chaos", "13_benchmarks"]


SECOND_QUESTION = re.compile(r"^(?P<name>\w+) = panels\.SelfCheck\(stage\.(?P<prediction>\w+)\)$", re.MULTILINE)


def test_a_notebook_s_further_questions_hold_back_their_runs_too():
    """A question a notebook asks besides its stage's own (02: how many jobs a retry without a key makes) is a
    prediction of the stage's too: nothing above it spells its answer, and the saved cells it holds back
    show only the line saying to answer first."""
    picture = f'<div class="reliableq-picture"><i>{html.escape(panels.ANSWER_FIRST)}</i></div>'
    asked_anywhere = []
    for stage, path in zip(reliableq_stages.STAGES, _notebooks()[1:12], strict=True):
        cells = json.loads(path.read_text())["cells"]
        sources = ["".join(cell["source"]) for cell in cells]
        for at, source in enumerate(sources):
            found = SECOND_QUESTION.search(source)
            if found is None or found["prediction"] == "PREDICTION":
                continue
            asked_anywhere.append(path.stem)
            answer = getattr(stage, found["prediction"]).answer
            assert not [above for above in sources[:at + 1] if answer in above], path.stem
            held = [cell for cell, text in zip(cells, sources, strict=True)
                    if text.startswith(f"with {found['name']}.hidden_until_answered():\n")]
            assert held and all([(o["output_type"], "".join(o.get("data", {}).get("text/html", "")))
                                 for o in cell["outputs"]] == [("display_data", picture)] for cell in held)
    assert "02_commit_before_ack" in asked_anywhere


def test_opening_a_notebook_changes_nothing_jupyterlab_would_mark_modified():
    """JupyterLab writes the running kernel's kernelspec (and language) into a notebook as its kernel
    connects; a notebook saved with another ("Python 3") is then modified before the learner did a thing,
    and asks to be saved on close. Every notebook is saved with exactly what it would write."""
    written = kernelspec_as_jupyterlab_writes_it()
    assert written["display_name"] == "Python 3 (ipykernel)"  # ipykernel's own name for the kernel
    stale = {path.stem: json.loads(path.read_text())["metadata"]["kernelspec"] for path in _notebooks()}
    assert {stem: spec for stem, spec in stale.items() if spec != written} == {}


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_saved_notebooks_show_pictures_not_dead_widgets(path):
    """Opened before it is run, a notebook holds no widget views and no widget state (JupyterLab would
    draw them disconnected); each panel and prediction is a static picture saying to run the notebook.
    Every stage notebook has its scenario panel, the chaos notebook its chaos panel."""
    notebook = json.loads(path.read_text())
    assert "widgets" not in notebook["metadata"]
    outputs = [output for cell in notebook["cells"] for output in cell.get("outputs", [])]
    assert not [output for output in outputs if WIDGET_VIEW in output.get("data", {})]
    pictures = ["".join(output["data"]["text/html"]) for output in outputs
                if "reliableq-picture" in "".join(output.get("data", {}).get("text/html", ""))]
    if path.stem[:2] not in ("00", "13"):
        button = "Run chaos" if path.stem.startswith("12") else "Run scenario"
        assert any(button in picture and "Run the notebook" in picture for picture in pictures), path.stem


def test_a_panel_shows_live_with_a_picture_beside_it():
    """What a panel displays: the live widget view, and the picture a saved notebook keeps of it."""
    shown = []
    panel = panels.ScenarioPanel(reliableq_stages.get("leases"), ScenarioParams(seed=1))
    with patch("reliableq.lab.panels.display", side_effect=lambda bundle, raw: shown.append(bundle)):
        panel._ipython_display_()  # what IPython's display() calls in a kernel
    (bundle,) = shown
    assert bundle[WIDGET_VIEW]["model_id"] == panel.widget.model_id
    assert "☐ leases" not in bundle["text/html"] and "☑ leases" in bundle["text/html"]
    assert "crash at stage default ·" in bundle["text/html"]
    assert "failure rate 1.0 (not used by this stage)" in bundle["text/html"]


def test_resaving_drops_only_the_widget_views_that_have_a_picture():
    """A view with a picture beside it goes, a view without one stays (nothing shown is lost), and the
    notebook's widget state goes."""
    notebook = nbformat.v4.new_notebook(metadata={"widgets": {WIDGET_STATE: {"state": {}}}})
    cell = nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("display_data", {WIDGET_VIEW: {"model_id": "a"}, "text/html": "<b>p</b>"}),
        nbformat.v4.new_output("display_data", {WIDGET_VIEW: {"model_id": "b"}, "text/plain": "Button()"})])
    notebook.cells.append(cell)
    kept = without_live_widgets(notebook)
    assert "widgets" not in kept.metadata
    assert [list(output["data"]) for output in kept.cells[0].outputs] == [["text/html"], [WIDGET_VIEW, "text/plain"]]


@pytest.mark.slow
def test_lab_command_serves_the_learners_copies_in_the_workspace_with_the_database_url_set():
    """`reliableq lab` copies notebooks/ into the learner's workspace and starts JupyterLab there, on loopback,
    the copies trusted; its kernels get the workspace, and DATABASE_URL only if the learner set it."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "reliableq", "lab", "--no-browser", "--port", str(port),
                                "--token", "lab-test"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def contents() -> httpx.Response | None:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/api/contents?token=lab-test", timeout=2)
            except httpx.HTTPError:
                return None  # not listening yet
            return response if response.status_code == 200 else None
        response = asyncio.run(wait_until(contents, 60, "JupyterLab to list the notebooks", interval=0.2))
        listed = {item["name"] for item in response.json()["content"]}
        assert "00_start_here.ipynb" in listed
        # Trusted, so JupyterLab renders the saved widgets instead of their text fallback.
        notary = NotebookNotary()
        workspace = Path(os.environ[WORKSPACE_VARIABLE])
        copies = sorted(workspace.glob("*.ipynb"))
        assert [p.name for p in copies] == [p.name for p in _notebooks()]
        assert all(notary.check_signature(nbformat.read(p, nbformat.NO_CONVERT)) for p in copies)
        jupyter = psutil.Process(process.pid)  # the CLI became JupyterLab (exec): signals reach it
        assert "jupyterlab" in " ".join(jupyter.cmdline())
        assert jupyter.environ()[WORKSPACE_VARIABLE] == str(workspace)
        # The learner's DATABASE_URL, or none: the kernels then find the same embedded server.
        assert jupyter.environ().get("DATABASE_URL") == os.environ.get("DATABASE_URL")
        # A terminal opened in JupyterLab finds `reliableq`: not a login shell (whose /etc/profile resets PATH,
        # as JupyterLab's default is when its output is not a terminal, as here), this venv's scripts first.
        terminal = httpx.post(f"http://127.0.0.1:{port}/api/terminals?token=lab-test", timeout=10)
        assert terminal.status_code == 200, terminal.text
        named = Path(os.environ.get("SHELL") or "sh").name
        (shell,) = [child for child in jupyter.children() if child.name() == named]
        assert "-l" not in shell.cmdline() and "--login" not in shell.cmdline(), shell.cmdline()
        # ...and opens in the workspace, beside the notebooks and the exercise files, wherever lab was started.
        assert Path(shell.cwd()) == workspace.resolve()
        assert shutil.which("reliableq", path=shell.environ()["PATH"]) == str(Path(sys.executable).parent / "reliableq")
    finally:
        process.terminate()
        process.wait(20)


def test_an_interrupted_cell_ends_in_one_line_and_other_errors_keep_their_traceback(capsys):
    """JupyterLab's ■ interrupts the kernel: the cell's run is cancelled, and the learner reads one line, not
    the traceback of every task it stopped. Any other exception is still shown as IPython shows it."""
    import matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    nb.say_interrupts_in_one_line(shell)
    for interrupted in ("raise KeyboardInterrupt", "import asyncio\nraise asyncio.CancelledError()"):
        shell.run_cell("import matplotlib.pyplot as plt\nplt.subplots()\n" + interrupted)
        said = capsys.readouterr()
        assert nb.STOPPED in said.err and "Traceback" not in said.out + said.err, said
        assert not plt.get_fignums(), "a chart the stopped cell began would be shown under the line"
    shell.run_cell("1 / 0")
    said = capsys.readouterr()
    assert "ZeroDivisionError" in said.out + said.err and nb.STOPPED not in said.out + said.err


def test_an_interrupt_python_drops_while_tidying_up_is_said_in_one_line(capsys, monkeypatch):
    """A Stop that lands in a finalizer (matplotlib's weak-reference callbacks, while a chart is drawn) cannot
    be raised in the cell: Python printed "Exception ignored in" and a traceback. Now one line says so; any
    other exception Python drops still goes to the hook that was there."""
    from IPython.core.interactiveshell import InteractiveShell
    others = []
    monkeypatch.setattr(sys, "unraisablehook", others.append)
    nb.say_interrupts_in_one_line(InteractiveShell.instance())
    nb.say_interrupts_in_one_line(InteractiveShell.instance())  # once more, as a notebook run twice does

    class TidiedUp:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    TidiedUp(KeyboardInterrupt())
    said = capsys.readouterr()
    assert said.err.count(nb.STOP_LOST) == 1 and "Traceback" not in said.err and not others, said
    TidiedUp(ValueError("a finalizer's own bug"))
    assert [type(unraisable.exc_value) for unraisable in others] == [ValueError]
    assert nb.STOP_LOST not in capsys.readouterr().err
