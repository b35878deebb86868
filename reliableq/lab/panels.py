"""The notebooks' interactive pieces: a panel that re-runs a stage's scenario, one that runs the chaos
suite, one that checks the learner's own code for an exercise, and the "predict, then run" check, which
holds back the results of the runs it asks about until it is answered.

A panel shows exactly one result, right under its buttons: a new run replaces the last. While a run is
going, a status line says what it runs, for how long, and the wait under way with its deadline; Stop (or
JupyterLab's interrupt, ■, while no cell runs) ends the run, and its system is torn down as after any run
(workers stopped, servers closed, scratch databases dropped). A run that fails says, in one line, how
long it really ran and why — never a traceback. Each piece also carries a static picture of itself, which
is all a saved notebook keeps of it (reliableq/lab/resave.py): a notebook opened before it is run shows
the pictures, each saying to run the notebook (or, for a result held back, to answer the prediction),
instead of widgets without a kernel. What this does not do: decide anything about a job; it calls the
stages and the chaos suite.
"""

from __future__ import annotations

import asyncio
import html
import io
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython import get_ipython
from IPython.core.displaypub import DisplayPublisher
from IPython.display import HTML, display

from reliableq.config import Mechanisms
from reliableq.lab.chaos import SHOWN_BY_CHAOS, ChaosConfig, ChaosReport, run_chaos
from reliableq.lab.experiment import STAGE_KNOBS, Prediction, Stage
from reliableq.lab.faults import CRASH_POINTS
from reliableq.lab.notebook import views
from reliableq.lab.scenario import ScenarioParams, ScenarioResult, run_name
from reliableq.lab.waiting import Watch, watching

TICK_SECONDS = 0.5  # how often the status line of a run in progress is redrawn
STAGE_DEFAULT = "stage default"  # the crash-point choice that leaves the stage's own story alone
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
RUN_FIRST = "Run the notebook (Run ▸ Run All Cells) to use this panel."
KERNEL_GONE = "This panel's kernel is gone (shut down or restarted): run all cells again to use it."
ANSWER_FIRST = "Answer the prediction above (pick one, press Check) to see what the run did."
# The kernel cannot say it is gone, so the page does, by CSS: JupyterLab 4 marks a widget view whose kernel
# restarted as `jupyter-widgets-disconnected`, and a notebook whose kernel was shut down or died shows an
# execution indicator of status "unknown" or "dead" (a browser test shuts a kernel down and sees the notice).
_GONE = ".reliableq-kernel-gone"
_KERNEL_GONE_NOTICE = (
    f"<style>{_GONE}{{display:none;color:#b00}}"
    f".jupyter-widgets-disconnected {_GONE},"
    f'.jp-NotebookPanel:has(.jp-Notebook-ExecutionIndicator:is([data-status="unknown"],[data-status="dead"])) '
    f"{_GONE}{{display:block}}"
    # A panel's text wraps at spaces: JupyterLab's outputs break anywhere ("RUNNING -> SUCC" / "EEDED").
    ".widget-output pre{word-break:normal;overflow-wrap:break-word}"
    # A reopened notebook's widgets are drawn from their saved state, each marked with a red broken link: the
    # notice above says what to do once, instead of a mark on every checkbox that reads as breakage.
    ".jupyter-widgets-disconnected::before{display:none}</style>"
    f'<div class="{_GONE[1:]}">⚠ {html.escape(KERNEL_GONE)}</div>')


class Pictured:
    """A widget shown live where a kernel draws it, and as a static picture of itself where none does."""

    widget: widgets.Widget

    def picture(self) -> str:
        raise NotImplementedError

    def plain(self) -> str:
        """The picture for a reader that shows no HTML."""
        return f"{type(self).__name__}: run the notebook to use it"

    def _ipython_display_(self) -> None:
        view = self.widget._repr_mimebundle_()[WIDGET_VIEW]
        display({WIDGET_VIEW: view, "text/html": f'<div class="reliableq-picture">{self.picture()}</div>',
                 "text/plain": self.plain()}, raw=True)


def _box(checked: bool) -> str:
    return "☑" if checked else "☐"


class RunPanel(Pictured):
    """A Run button, a Stop button, a live status line and one result; subclasses say what a run is
    (`describe`), do it (`work`) and show its result (`show`)."""

    def __init__(self, header: widgets.Widget, controls: widgets.Widget, run_label: str) -> None:
        self.button = widgets.Button(description=run_label, button_style="primary", icon="play")
        self.stop_button = widgets.Button(description="Stop", icon="stop", disabled=True)
        self.status = widgets.HTML(_line("", f"Press {run_label}."))
        self.output = widgets.Output()
        self._work: asyncio.Task | None = None
        self.watch = Watch()
        self.button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = widgets.VBox([header, controls, widgets.HBox([self.button, self.stop_button]),
                                    widgets.HTML(_KERNEL_GONE_NOTICE), self.status, self.output])

    def describe(self) -> str:
        raise NotImplementedError

    async def work(self) -> Any:
        raise NotImplementedError

    def show(self, result: Any) -> None:
        raise NotImplementedError

    def pictured_button(self) -> str:
        """The Run button in a panel's picture: greyed, and saying how to bring the panel to life."""
        return f"<button disabled>▶ {html.escape(self.button.description)}</button> <i>{RUN_FIRST}</i>"

    def mark(self, result: Any) -> str:
        """The status line's mark for a run that ended with `result`: it ran to its end."""
        return "✔"

    def start(self) -> asyncio.Task:
        """What the Run button does: run in the background; the panel itself reports how it ended.

        The run reads the switches as the kernel has them, so a tick sent before the click must be handled
        before it. With JupyterLab's default of sending widget messages over a kernel subshell, ipykernel
        7 routes each widget's messages to the thread that last wrote to that widget: a tick could go to
        the main thread and the click to the subshell, and the click won (in the browser test, one run in
        two read the old switch). The lab's JupyterLab defaults (jupyterlab_overrides.json) keep widget
        messages on the main shell, where they are handled in the order sent."""
        task = asyncio.ensure_future(self.run())
        task.add_done_callback(_reported)
        return task

    def stop(self) -> None:
        if self._work is not None:
            self._work.cancel()

    async def run(self) -> Any:
        """One run with the panel's current settings; its result replaces the last. Returns the result;
        raises what ended the run, after the status line has said it."""
        what = self.describe()
        watch = self.watch = Watch()  # what the run waits for now (the status line's, and a test's)
        began = time.monotonic()
        # Reset the synced outputs themselves: clear_output() works only inside a cell's execution, and a
        # button's callback runs outside one, so the old result used to stay above the new.
        self.output.outputs = ()
        self.button.disabled, self.stop_button.disabled = True, False
        self._work = asyncio.create_task(self.work(), context=watching(watch))
        ticker = asyncio.create_task(self._tick(what, watch, began))
        _interrupt_stops(self)
        try:
            result = await self._work
        except asyncio.CancelledError:
            self.status.value = _line("■", f"stopped after {time.monotonic() - began:.0f} s: {what}")
            raise
        except Exception as error:  # the learner reads it here; the kernel must not print a traceback
            # The first line says what it waited for; the rest (a timed-out wait's report of what was
            # stuck) is for whoever wants to dig, folded away under the line.
            reason, _, details = str(error).partition("\n")
            self.status.value = _line("✗", f"{what} gave up after {time.monotonic() - began:.0f} s: {reason}")
            if details:
                self.output.append_display_data(HTML(f"<details><summary>what was stuck</summary>"
                                                     f"<pre>{html.escape(details)}</pre></details>"))
            raise
        finally:
            ticker.cancel()
            _no_longer_stopped_by_interrupt(self)
            self._work = None
            self.button.disabled, self.stop_button.disabled = False, True
        self.status.value = _line(self.mark(result), f"{what}: done in {time.monotonic() - began:.1f} s")
        self.show(result)
        return result

    async def _tick(self, what: str, watch: Watch, began: float) -> None:
        while True:
            now = time.monotonic()
            step = f"; {watch.step}" if watch.step else ""
            waiting = (f"; waiting for {watch.what} ({now - watch.since:.0f} s of at most {watch.timeout:g} s)"
                       if watch.what else "")
            self.status.value = _line("◷", f"running {what}: {now - began:.0f} s{step}{waiting}")
            await asyncio.sleep(TICK_SECONDS)


# JupyterLab's interrupt (■) stops the panels' runs too. ipykernel ignores SIGINT while no cell runs (its
# idle handler is SIG_IGN), and a panel runs in the background of an idle kernel, so ■ did nothing to it
# (the rehearsal: the run went on to its end). While a panel runs, the idle kernel's handler is one that
# stops it as its Stop button does. ipykernel sets its own for the length of each message it handles (the
# click that starts a run, or a cell: ■ interrupts a running cell, as always) and puts back the one it
# found, kept in `saved_sigint_handler`: a run that starts inside a handler puts its own there. Anywhere
# else (a test, a plain Python loop) the handler in place is left alone.
_stopped_by_interrupt: set[RunPanel] = set()


def _interrupt_stops(panel: RunPanel) -> None:
    kernel = getattr(get_ipython(), "kernel", None)
    kernels_idle_handler = getattr(kernel, "saved_sigint_handler", None)  # what ipykernel puts back after a message
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop_panels)
    elif kernels_idle_handler is signal.SIG_IGN:
        kernel.saved_sigint_handler = _stop_panels
    elif _stop_panels not in (signal.getsignal(signal.SIGINT), kernels_idle_handler):
        return
    _stopped_by_interrupt.add(panel)


def _no_longer_stopped_by_interrupt(panel: RunPanel) -> None:
    _stopped_by_interrupt.discard(panel)
    if _stopped_by_interrupt:
        return
    kernel = getattr(get_ipython(), "kernel", None)
    if signal.getsignal(signal.SIGINT) is _stop_panels:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the idle kernel's own
    if getattr(kernel, "saved_sigint_handler", None) is _stop_panels:
        kernel.saved_sigint_handler = signal.SIG_IGN


def _stop_panels(signum: int, frame: Any) -> None:
    # A signal handler runs between two bytecodes of the loop's thread: the stops run as the loop's next
    # callbacks, not in the middle of whatever it was doing.
    for panel in list(_stopped_by_interrupt):
        if panel._work is not None:
            panel._work.get_loop().call_soon_threadsafe(panel.stop)


# Marks from DejaVu Sans and the common desktop fonts: emoji (❌ ⏳) showed as boxes without an emoji font.
def _line(mark: str, text: str) -> str:
    # Wrapped at spaces, never inside a word.
    return f'<div style="word-break: normal; overflow-wrap: normal">{mark} {html.escape(text)}</div>'


def _reported(task: asyncio.Task) -> None:
    """Mark a panel run's outcome as seen: its status line already says how it ended."""
    if not task.cancelled():
        task.exception()


class ScenarioPanel(RunPanel):
    """Re-run a stage's scenario live: every mechanism switch, and the scenario's knobs."""

    def __init__(self, stage: Stage, params: ScenarioParams = ScenarioParams()) -> None:
        self.stage = stage
        initial = stage.mechanisms(True)
        self.switches = {name: widgets.Checkbox(value=getattr(initial, name), description=name, indent=False)
                         for name in Mechanisms.names()}
        self.lease = widgets.FloatSlider(value=params.lease_seconds, min=0.5, max=3.0, step=0.25,
                                         description="lease (s)")
        # A string, not None, for the default: a Dropdown shows a None value as a blank box.
        self.crash_point = widgets.Dropdown(options=[STAGE_DEFAULT, *CRASH_POINTS[:3]],
                                            value=params.crash_point or STAGE_DEFAULT, description="crash at")
        self.failure_rate = widgets.FloatSlider(value=params.failure_rate, min=0.0, max=1.0, step=0.05,
                                                description="failure rate")
        self.concurrency = widgets.IntSlider(value=params.concurrency, min=1, max=8, description="concurrency")
        self.jobs = widgets.IntSlider(value=params.jobs, min=1, max=8, description="jobs")
        self.seed = widgets.IntText(value=params.seed, description="seed")
        self.last_result: ScenarioResult | None = None
        switches = widgets.HBox([widgets.VBox(list(self.switches.values())[:4]),
                                 widgets.VBox(list(self.switches.values())[4:])])
        unused = [knob for knob in STAGE_KNOBS if knob not in stage.OWN_KNOBS]
        for knob in unused:  # shown greyed out, so that the panel looks the same in every notebook
            getattr(self, knob).disabled = True
        note = widgets.HTML(f"<small>{' and '.join(k.replace('_', ' ') for k in unused)}: not used by this stage"
                            "</small>" if unused else "")
        knobs = widgets.VBox([self.lease, self.crash_point, self.failure_rate, self.concurrency, self.jobs, self.seed,
                              note])
        super().__init__(widgets.HTML(f"<b>Stage {stage.NAME}</b>: {html.escape(stage.FAILURE)}"),
                         widgets.HBox([switches, knobs]), "Run scenario")

    def mechanisms(self) -> Mechanisms:
        return Mechanisms(**{name: box.value for name, box in self.switches.items()})

    def params(self) -> ScenarioParams:
        crash_point = None if self.crash_point.value == STAGE_DEFAULT else self.crash_point.value
        return ScenarioParams(seed=self.seed.value, jobs=self.jobs.value, lease_seconds=self.lease.value,
                              crash_point=crash_point, failure_rate=self.failure_rate.value,
                              concurrency=self.concurrency.value, mechanisms=self.mechanisms())

    def describe(self) -> str:
        return f"stage {self.stage.NAME} with {run_name(self.stage.MECHANISM, self.mechanisms())}"

    def picture(self) -> str:
        switches = " ".join(f"{_box(box.value)} {name}" for name, box in self.switches.items())
        knobs = " · ".join(f"{knob.description} {html.escape(str(knob.value))}"
                           + (" (not used by this stage)" if knob.disabled else "")
                           for knob in (self.lease, self.crash_point, self.failure_rate, self.concurrency,
                                        self.jobs, self.seed))
        return (f"<b>Stage {self.stage.NAME}</b>: {html.escape(self.stage.FAILURE)}<br>{switches}<br>{knobs}<br>"
                f"{self.pictured_button()}")

    async def work(self) -> ScenarioResult:
        mechanism_on = True if self.stage.MECHANISM is None else self.switches[self.stage.MECHANISM].value
        return await self.stage.scenario(mechanism_on, self.params())

    def show(self, result: ScenarioResult) -> None:
        self.last_result = result
        append_views(self.output, result)


def append_views(output: widgets.Output, result: ScenarioResult) -> None:
    """A run's summary, table, chart and timeline, under a panel's buttons."""
    # append_* rather than `with output:`, which captures only inside a kernel's cell execution.
    for view in views(result):
        if isinstance(view, str):
            output.append_stdout(view + "\n")
        else:
            output.append_display_data(view)


class ChaosPanel(RunPanel):
    """Pick a mechanism to switch off and run the chaos suite; its report appears in the panel."""

    def __init__(self, config: ChaosConfig) -> None:
        self.config = config
        self.mechanism = widgets.Dropdown(options=SHOWN_BY_CHAOS, value="fencing", description="switch off")
        super().__init__(widgets.HTML("<b>Chaos</b>: seeded crashes, pauses and outages, every invariant checked"),
                         self.mechanism, "Run chaos")

    def describe(self) -> str:
        return f"chaos with {self.mechanism.value} off"

    def picture(self) -> str:
        return (f"{self.widget.children[0].value}<br>switch off: {self.mechanism.value}<br>"
                f"{self.pictured_button()}")

    async def work(self) -> ChaosReport:
        return await run_chaos(replace(self.config, mechanisms=Mechanisms().without(self.mechanism.value)))

    def show(self, report: ChaosReport) -> None:
        self.output.append_stdout(report.text() + "\n")


class SelfCheck(Pictured):
    """A stage's 'predict, then run' question: pick an answer, press Check, read why. The cells that run
    what it asks about show their results through it (`hidden_until_answered`), so that Run All does not
    answer the question before the learner has."""

    def __init__(self, prediction: Prediction) -> None:
        self.answer, self.why = prediction.answer, prediction.why
        self.choice = widgets.RadioButtons(options=list(prediction.options), value=None,
                                           layout={"width": "max-content"})
        self.button = widgets.Button(description="Check")
        self.feedback = widgets.HTML()
        self.button.on_click(lambda _: self.check())
        self.question = prediction.question
        self.answered = False
        self.held: list[HiddenResult] = []
        self.widget = widgets.VBox([widgets.HTML(f"<b>Predict:</b> {html.escape(prediction.question)}"), self.choice,
                                    self.button, self.feedback])

    def picture(self) -> str:
        options = "".join(f"<li>{html.escape(option)}</li>" for option in self.choice.options)
        return (f"<b>Predict:</b> {html.escape(self.question)}<ul>{options}</ul>"
                "<i>Run the notebook (Run ▸ Run All Cells) to check your prediction.</i>")

    def check(self) -> bool:
        """Say whether the pick is right, and why; any pick, right or wrong, shows every held result."""
        if self.choice.value is None:
            self.feedback.value = "Pick an answer first."
            return False
        correct = self.choice.value == self.answer
        if correct:
            self.feedback.value = f"✓ Right. {html.escape(self.why)}"
        else:
            self.feedback.value = (f"✗ Not quite: the answer is <i>{html.escape(self.answer)}</i>. "
                                   f"{html.escape(self.why)}")
        self.answered = True
        for held in self.held:
            held.show()
        return correct

    @contextmanager
    def hidden_until_answered(self) -> Iterator[None]:
        """The block's outputs (what it prints, logs, displays and draws) appear in its cell once this question
        is answered; until then the cell says to answer it first."""
        held = HiddenResult()
        self.held.append(held)
        display(held)
        try:
            with held.recording():
                yield
        finally:
            if self.answered:  # a cell run after the answer shows its result at once
                held.show()


class HiddenResult(Pictured):
    """One cell's outputs, held in the kernel until its prediction is answered: until then the page has
    nothing of them (a saved notebook, or one autosaved by JupyterLab, cannot give the answer away), only
    the line saying to answer first."""

    def __init__(self) -> None:
        self.outputs: list[dict[str, Any]] = []  # nbformat outputs, in the order the cell made them
        self.lock = threading.Lock()  # the API logs from its server's thread while the cell runs
        self.output = widgets.Output()
        self.widget = widgets.VBox([widgets.HTML(self.picture()), self.output])

    def picture(self) -> str:
        return f"<i>{html.escape(ANSWER_FIRST)}</i>"

    def plain(self) -> str:
        return ANSWER_FIRST

    def show(self) -> None:
        self.widget.children = (self.output,)
        self.output.outputs = tuple(self.outputs)

    def record(self, output: dict[str, Any]) -> None:
        """Keep an output; consecutive writes to one stream make one output, as in a cell."""
        with self.lock:
            last = self.outputs[-1] if self.outputs else {}
            if output["output_type"] == "stream" == last.get("output_type") and output["name"] == last["name"]:
                last["text"] += output["text"]
            else:
                self.outputs.append(output)

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Record, instead of showing, what the block prints to stdout and stderr (log lines included: a
        logger without a handler of its own writes to the current sys.stderr), what it displays, and the
        matplotlib figures it leaves open, which the inline backend would otherwise draw once the cell ends."""
        shell = get_ipython()
        figures = set(plt.get_fignums())
        sys.stdout.flush()
        sys.stderr.flush()
        kept = sys.stdout, sys.stderr, shell.display_pub
        sys.stdout, sys.stderr = _RecordedStream(self, "stdout"), _RecordedStream(self, "stderr")
        shell.display_pub = _RecordedDisplays(self)
        try:
            yield
        finally:
            sys.stdout, sys.stderr, shell.display_pub = kept
            for number in sorted(set(plt.get_fignums()) - figures):
                data, metadata = shell.display_formatter.format(plt.figure(number))
                self.record({"output_type": "display_data", "data": data, "metadata": metadata})
                plt.close(number)


class _RecordedStream(io.TextIOBase):
    """sys.stdout or sys.stderr while a HiddenResult records."""

    def __init__(self, held: HiddenResult, name: str) -> None:
        self.held, self.name = held, name

    def write(self, text: str) -> int:
        self.held.record({"output_type": "stream", "name": self.name, "text": text})
        return len(text)


class _RecordedDisplays(DisplayPublisher):
    """The shell's display publisher while a HiddenResult records."""

    def __init__(self, held: HiddenResult) -> None:
        super().__init__()
        self.held = held

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs) -> None:
        self.held.record({"output_type": "display_data", "data": data, "metadata": metadata or {}})

    def set_parent(self, parent) -> None:
        """ipykernel names the message it handles to the shell's publisher, a widget's click included, which
        it handles while an async cell runs (the learner answering during Run All): what this records is
        the held cell's whatever message is being handled, so there is nothing to name."""
