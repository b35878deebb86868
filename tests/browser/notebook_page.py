"""Driving one notebook in JupyterLab 4 the way a learner does: open it, use the menus, read what the page
shows. Every wait is Playwright's own (auto-waiting locators, `expect`, `wait_for_function` with a
deadline); none sleeps.

What it reads is the DOM of JupyterLab 4.x (class names such as `.jp-CodeCell`, the execution indicator's
`data-status`): a major JupyterLab upgrade may need these selectors updated. It does not see the kernel
or the notebook file, only the page.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from playwright.sync_api import Locator, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser.lab_server import LabServer

# Opening a notebook starts its kernel, which imports pandas, matplotlib and the lab.
KERNEL_START_SECONDS = 60.0
KERNEL_IDLE = re.compile(r"\S \| Idle")
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'

# True once a "Run All Cells" started on cleared outputs has ended: the kernel is idle, no cell waits
# ("[*]"), and either every code cell shows an execution count or an error output stopped the run
# (JupyterLab then clears the "[*]" of the cells it will not run). Outputs were cleared first, so neither
# can be left over from the saved notebook, whose counts are the same numbers a fresh kernel gives.
_RUN_ENDED = """(stderr) => {
  const panel = document.querySelector('.jp-NotebookPanel');
  const idle = panel.querySelector('.jp-Notebook-ExecutionIndicator[data-status="idle"]');
  const prompts = [...panel.querySelectorAll('.jp-CodeCell')]
    .filter(cell => cell.querySelector('.cm-content').textContent.trim() !== '')
    .map(cell => cell.querySelector('.jp-InputArea-prompt').textContent.trim());
  if (!idle || prompts.includes('[*]:')) return false;
  return prompts.every(p => /^\\[\\d+\\]:$/.test(p)) || panel.querySelector(stderr) !== null;
}"""

_NOT_RUN = """() => [...document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell')]
  .map((cell, index) => ({index, source: cell.querySelector('.cm-content').textContent.trim(),
                          prompt: cell.querySelector('.jp-InputArea-prompt').textContent.trim()}))
  .filter(cell => cell.source !== '' && !/^\\[\\d+\\]:$/.test(cell.prompt))
  .map(cell => `code cell ${cell.index + 1} (${cell.prompt || 'no prompt'}): ${cell.source.slice(0, 80)}`)"""


class NotebookPage:
    """One notebook open alone in a JupyterLab tab."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.panel = page.locator(".jp-NotebookPanel")

    @classmethod
    def open(cls, page: Page, lab: LabServer, path: str, workspace: str) -> NotebookPage:
        """Open `path` (relative to the served folder) and wait until its kernel is idle; its saved outputs,
        widgets included, are shown as they were saved."""
        page.goto(lab.notebook_url(path, workspace))
        # The status bar's "Python 3 (ipykernel) | Idle": the toolbar's execution indicator says idle before
        # any kernel exists, the status bar names a kernel's state only once there is one.
        expect(page.locator("#jp-main-statusbar")).to_contain_text(KERNEL_IDLE, timeout=KERNEL_START_SECONDS * 1000)
        return cls(page)

    def menu(self, menu: str, item: str) -> None:
        """Click `menu` in the menu bar, then its `item`, by their visible names."""
        self.page.get_by_role("menubar").get_by_role("menuitem", name=menu, exact=True).click()
        self.page.get_by_role("menu").get_by_role("menuitem", name=item, exact=True).click()

    def start_run_all(self) -> None:
        """Clear every output and Run > Run All Cells, without waiting for it (a learner acting meanwhile)."""
        self.menu("Edit", "Clear Outputs of All Cells")
        self.menu("Run", "Run All Cells")

    def run_all_cells(self, timeout_seconds: float, expected_stderr: Sequence[str] = (),
                      started: bool = False) -> None:
        """Clear every output, Run > Run All Cells (unless `started` already), and wait for the run to end.
        Fails, with the text shown, on any error output and on any stderr line not matched in full by a
        pattern of `expected_stderr` (a learner sees both as the same pink box), then on any code cell left
        without an execution count."""
        if not started:
            self.start_run_all()
        try:
            self.page.wait_for_function(_RUN_ENDED, arg=STDERR, timeout=timeout_seconds * 1000, polling=250)
        except PlaywrightTimeoutError:
            raise AssertionError(f"Run All Cells had not ended after {timeout_seconds:g}s; cells not run yet:\n"
                                 + "\n".join(self.cells_not_run())) from None
        unexpected = [text for text in self.stderr_outputs()
                      if not all(any(re.fullmatch(pattern, line) for pattern in expected_stderr)
                                 for line in text.strip().splitlines())]
        assert not unexpected, "error output in the notebook:\n" + "\n-----\n".join(unexpected)
        not_run = self.cells_not_run()
        assert not not_run, "cells without an execution count after Run All Cells:\n" + "\n".join(not_run)

    def run_cells(self, *containing: str, timeout_seconds: float) -> None:
        """Clear every output, then run only the code cells whose source contains each of `containing`, in
        that order, as a learner does: click into the cell, Shift+Enter, and wait for its execution count.
        Fails, with the text shown, on any error or stderr output."""
        self.menu("Edit", "Clear Outputs of All Cells")
        for text in containing:
            cell = self.code_cell(text)
            cell.locator(".jp-InputArea-editor").click()
            self.page.keyboard.press("Shift+Enter")
            expect(cell.locator(".jp-InputArea-prompt")).to_have_text(re.compile(r"\[\d+\]:"),
                                                                      timeout=timeout_seconds * 1000)
        errors = self.stderr_outputs()
        assert not errors, "error output in the notebook:\n" + "\n-----\n".join(errors)

    def cells_not_run(self) -> list[str]:
        """Code cells with source that show no execution count, by position and first line."""
        return self.page.evaluate(_NOT_RUN)

    def stderr_outputs(self) -> list[str]:
        """The text of every error or stderr output, in the cells and inside widgets (textContent: cells
        scrolled out of view are not rendered, so their innerText would be empty)."""
        return self.panel.locator(STDERR).all_text_contents()

    def code_cell(self, containing: str) -> Locator:
        """The one code cell whose source contains `containing`."""
        return self.panel.locator(".jp-CodeCell").filter(
            has=self.page.locator(".jp-InputArea-editor", has_text=containing))
