"""What the notebooks call (reliableq.lab.notebook), `reliableq lab`, and the saved widget state that lets
the notebooks' widgets render when opened in JupyterLab."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import nbformat
import psutil
import pytest
from nbformat.sign import NotebookNotary

import stages
from reliableq.lab import notebook as nb
from reliableq.lab import panels
from reliableq.lab.experiment import Prediction, ScenarioParams, compare
from reliableq.lab.waiting import wait_until

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


async def test_tables_and_charts_show_the_counts_before_and_after():
    """counts_table stacks both runs; plot_counts draws one panel per run; the timeline has a lane per worker."""
    stage = stages.get("idempotency")
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
    panel = panels.ScenarioPanel(stages.get("idempotency"), ScenarioParams(seed=1, jobs=2))
    assert panel.switches["idempotency"].value is True
    panel.switches["idempotency"].value = False
    panel.lease.value = 0.5
    result = await panel.run()
    assert result.mechanisms.idempotency is False and result.params.lease_seconds == 0.5
    assert [row["C"] for row in result.rows()] == [2, 2]
    assert panel.output.outputs and not panel.button.disabled


async def test_a_second_run_replaces_the_first_in_the_panel():
    """Run with idempotency off, then on: the panel shows the second result only, with one summary."""
    panel = panels.ScenarioPanel(stages.get("idempotency"), ScenarioParams(seed=1, jobs=1))
    panel.switches["idempotency"].value = False
    first = await panel.run()
    panel.switches["idempotency"].value = True
    second = await panel.run()
    printed = "".join(o["text"] for o in panel.output.outputs if o["output_type"] == "stream")
    assert first.violations() and not second.violations()
    assert printed.count("Stage idempotency") == 1 and "idempotency on" in printed
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
    cells up to the question) spells out the answer; the run after it may."""
    for stage, path in zip(stages.STAGES, _notebooks()[1:10], strict=True):
        sources = ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]]
        asked = sources.index("panels.SelfCheck(stage.PREDICTION)")
        assert not [source for source in sources[:asked + 1] if stage.PREDICTION.answer in source], path.stem
    with pytest.raises(ValueError, match="not one of the options"):
        Prediction("?", ["a"], "b", "")


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def test_notebooks_are_in_reading_order_one_per_stage():
    """Start here, then one notebook per stage in stage order, then chaos and benchmarks."""
    names = [p.stem for p in _notebooks()]
    expected_stages = [f"{i:02d}_{s.NAME.replace('-', '_')}" for i, s in enumerate(stages.STAGES, start=1)]
    assert names[0] == "00_start_here"
    assert names[1:10] == expected_stages
    assert names[10:] == ["10_chaos", "11_benchmarks"]


@pytest.mark.parametrize("path", _notebooks()[1:10], ids=lambda p: p.stem)
def test_saved_widgets_have_their_state_in_the_notebook(path):
    """Every saved widget view refers to a model whose state is stored in the notebook, which is what
    JupyterLab needs to render it on opening; each stage notebook has its live panel."""
    notebook = json.loads(path.read_text())
    state = notebook["metadata"]["widgets"][WIDGET_STATE]["state"]
    views = [output["data"][WIDGET_VIEW]["model_id"] for cell in notebook["cells"] if cell["cell_type"] == "code"
             for output in cell.get("outputs", []) if WIDGET_VIEW in output.get("data", {})]
    assert views, "no widget output saved"
    assert all(model_id in state for model_id in views)
    buttons = [m for m in state.values() if m["model_name"] == "ButtonModel"]
    assert any(b["state"].get("description") == "Run scenario" for b in buttons)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_lab_command_serves_the_notebooks_with_the_database_url_set():
    """`reliableq lab` starts JupyterLab on loopback over notebooks/, trusted, with DATABASE_URL for its kernels."""
    port = _free_port()
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
        assert all(notary.check_signature(nbformat.read(p, nbformat.NO_CONVERT)) for p in _notebooks())
        jupyter = psutil.Process(process.pid)  # the CLI became JupyterLab (exec): signals reach it
        assert "jupyterlab" in " ".join(jupyter.cmdline())
        # The embedded default's `reliableq` database, or whatever DATABASE_URL already named.
        assert os.environ.get("DATABASE_URL", "dbname=reliableq") in jupyter.environ()["DATABASE_URL"]
    finally:
        process.terminate()
        process.wait(20)
