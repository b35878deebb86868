"""The notebooks' "Write it yourself" panel: the learner's workspace file, Check (the same checker as
`reliableq exercise check`), Hint, Reset, Solution and Give up. It lives with the exercises, not with
the other panels, because the exercises grade with the stages' scenarios, a layer above the lab's own.
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path

import ipywidgets as widgets
from IPython.display import HTML

from reliableq.lab import places
from reliableq.lab.exercises import Exercise, earlier_code, progress
from reliableq.lab.exercises.checker import DEFAULT_SEEDS, CheckResult, Outcome, check
from reliableq.lab.exercises.workspace import Workspace
from reliableq.lab.panels import RunPanel, append_views


class ExercisePanel(RunPanel):
    """Write it yourself: the learner's file in the workspace (a link that opens it in JupyterLab), Check
    (the same checker as `reliableq exercise check`), and Hint, Reset, Solution and Give up.

    The workspace is the CLI's (reliableq/lab/places.py) unless `workspace` names another; the starter is
    written there once, never over the learner's file. Progress is recorded there, as the CLI records it,
    and shown under the file's line. The verdict names the file and the moment it was saved, so a learner
    who forgot to save sees which version was graded. The solution shows after a pass, or after Give up."""

    def __init__(self, exercise: Exercise, workspace: Path | None = None, seed: int = 1,
                 seeds: int = DEFAULT_SEEDS) -> None:
        self.exercise, self.workspace = exercise, Workspace(workspace)
        self.seed, self.seeds = seed, seeds
        self.path, _ = self.workspace.start(exercise)
        self.last_result: CheckResult | None = None
        self.graded = ""  # which file and version the last check graded
        self.given_up = False
        self.hint_button = widgets.Button(description="Hint", layout={"width": "auto"})
        self.reset_button = widgets.Button(description="Reset", layout={"width": "auto"})
        self.solution_button = widgets.Button(description="Solution", layout={"width": "auto"})
        self.give_up_button = widgets.Button(description="Give up", layout={"width": "auto"})
        self.message = widgets.HTML()
        self.progress_line = widgets.HTML(self._progress())
        self.hint_button.on_click(lambda _: self.hint())
        self.reset_button.on_click(lambda _: self.reset())
        self.solution_button.on_click(lambda _: self.solution())
        self.give_up_button.on_click(lambda _: self.give_up())
        self._solution_allowed()
        # An Output, not an HTML widget: JupyterLab renders its HTML with the notebook's own link handling,
        # so the relative link opens the file in JupyterLab's editor.
        file_line = widgets.Output()
        file_line.append_display_data(HTML(self._file_line()))
        header = widgets.VBox([widgets.HTML(self._title()), file_line, self.progress_line])
        buttons = widgets.HBox([self.hint_button, self.reset_button, self.solution_button, self.give_up_button])
        super().__init__(header, widgets.VBox([buttons, self.message]), "Check")

    def _title(self) -> str:
        return (f"<b>Write it yourself: exercise {self.exercise.stage_number:02d} {self.exercise.name}</b>: "
                f"{html.escape(self.exercise.summary)}")

    def _file_line(self, live: bool = True) -> str:
        # A link relative to the notebook, which JupyterLab opens in its editor: live, from wherever this
        # kernel runs; in the saved picture, from the learner's copy of the notebook, beside the file in the
        # workspace `reliableq lab` serves.
        link = html.escape(os.path.relpath(self.path, Path.cwd()) if live else self.path.name)
        return (f'Your file: <a href="{link}" target="_blank"><code>{html.escape(self.path.name)}</code></a> '
                "in your workspace: open it, edit it, <b>save it</b>, then press <b>Check</b>.")

    def _progress(self) -> str:
        return f"<small>{html.escape(progress.yours(self.workspace))} (✓ passed, ✗ failing, · not yet)</small>"

    def _solution_allowed(self) -> None:
        self.solution_button.disabled = not (self.given_up or self.workspace.state(self.exercise) == "passed")

    def hint(self) -> str:
        return self._say(self.workspace.next_hint(self.exercise))

    def reset(self) -> str:
        path, backup = self.workspace.reset(self.exercise)
        return self._say(f"The starter is back in {path.as_posix()}"
                         + (f"; your version is in {backup.as_posix()}." if backup else "."))

    def give_up(self) -> str:
        self.given_up = True
        self._solution_allowed()
        return self.solution()

    def solution(self) -> str:
        self._refresh()
        if self.solution_button.disabled:
            return self._say("The solution shows after a pass, or after Give up.")
        self.message.value = (f"<pre>{html.escape(self.exercise.reference.rstrip())}</pre>"
                              f"<b>Why it works:</b> {html.escape(self.exercise.why)}")
        return self.exercise.reference

    def _say(self, text: str) -> str:
        self._refresh()
        self.message.value = html.escape(text)
        return text

    def _refresh(self) -> None:
        """The progress line and the Solution button as the workspace has them now: a check from a terminal
        records there too, and a hint that says "at its last check" must not contradict the line above it."""
        self.progress_line.value = self._progress()
        self._solution_allowed()

    def describe(self) -> str:
        # Named from the kernel's folder (the workspace, beside the notebook): the status line is saved with
        # the notebook, which must not carry one machine's folders.
        return f"the check of {self.exercise.name} ({places.shown(self.path)})"

    def picture(self) -> str:
        return (f"{self._title()}<br>{self._file_line(live=False)}<br>{self._progress()}<br>"
                f"{self.pictured_button()}")

    async def work(self) -> CheckResult:
        self.message.value = ""  # a hint or reset said before this check is about the file as it was then
        text = self.workspace.read(self.exercise)
        if text is None:
            raise FileNotFoundError(f"{self.path.as_posix()} is not there: press Reset to write the starter")
        self.graded = _graded(self.path)
        result = await check(self.exercise, text, seed=self.seed, seeds=self.seeds,
                             earlier=earlier_code(self.exercise, self.workspace))
        if result.outcome is not Outcome.COULD_NOT_RUN:
            self.workspace.record_check(self.exercise, text, result.outcome is Outcome.PASSED, result.lines)
            self.progress_line.value = self._progress()
        return result

    def mark(self, result: CheckResult) -> str:
        return {Outcome.PASSED: "✔", Outcome.FAILED: "✗", Outcome.COULD_NOT_RUN: "?"}[result.outcome]

    def show(self, result: CheckResult) -> None:
        self.last_result = result
        self._solution_allowed()
        self.output.append_stdout(f"{result.text()}\n{self.graded}\n")
        # One verdict: the stage's run is shown when it is the verdict's evidence (the check passed, or the
        # run itself broke the guarantee), never a run that held beside a check failed elsewhere.
        if result.run is not None and (result.outcome is Outcome.PASSED or result.run.breaches()):
            if result.outcome is Outcome.PASSED and result.run.breaches():
                # Beside a pass, "the guarantee broke" must read as what it is: a later stage's to fix.
                self.output.append_stdout("Your code in the stage's run, as the check saw it. What broke there "
                                          "is left to a later stage, as the run says:\n")
            append_views(self.output, result.run)


def _graded(path: Path) -> str:
    """Which file a check grades, and when it was last saved: an edit not saved yet is not in it. Said
    relative to the check, not to now: the line stays in the notebook, true whenever it is read again."""
    saved = path.stat().st_mtime
    ago = time.time() - saved
    when = f"{ago:.0f} s" if ago < 120 else f"{ago / 60:.0f} min" if ago < 7200 else "hours"
    return (f"Graded {path.name} as saved at {time.strftime('%H:%M:%S', time.localtime(saved))}, {when} before "
            "this check; unsaved edits in the editor are not in it.")
