"""Fixtures of the browser tests: one JupyterLab (over a copy of notebooks/) and one headless Chromium for all
of tests/browser, a fresh browser context per test, and, for each failed test, a screenshot of the page,
its console log and JupyterLab's log kept in test-artifacts/browser/.

Without Debian's chromium every test here is skipped, with one line saying what to install; the test
modules skip themselves the same way without the playwright package. Nothing outside this folder uses
these fixtures.

The tests here are plain (not async) functions: Playwright's sync API keeps an asyncio loop running in
this thread for as long as it lives, so nothing may call asyncio.run meanwhile. That is why the browser is
started after JupyterLab (whose start waits through asyncio) and both are package-scoped: they end with
the last test of this folder, before the rest of the suite's async tests run.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.browser.lab_server import LabServer, start_lab, stop_lab

# Debian's package: Playwright's own browser builds cannot be downloaded here. The variable lets a
# machine point elsewhere (and lets the skip be tried by naming a missing file).
CHROMIUM = Path(os.environ.get("RELIABLEQ_CHROMIUM", "/usr/bin/chromium"))
# The machine's network is closed: without the background-networking flags Chromium keeps trying to reach
# Google's hosts. Playwright's launch gives each browser a fresh, temporary --user-data-dir of its own.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
CONSOLE = pytest.StashKey[list[str]]()


@pytest.fixture(scope="package", autouse=True)
def chromium() -> Path:
    """The browser's executable; skips every test here when it is missing."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Debian's chromium is not installed (no {CHROMIUM}): apt-get install chromium")
    return CHROMIUM


@pytest.fixture(scope="package")
def jupyterlab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    lab = start_lab(tmp_path_factory.mktemp("browser-lab"))
    yield lab
    stop_lab(lab)


@pytest.fixture(scope="package")
def browser(chromium: Path, jupyterlab: LabServer):
    """Headless Chromium, driven by Playwright; requests `jupyterlab` so that it starts after it and stops
    before it (see the module's docstring)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, request: pytest.FixtureRequest):
    """A page in a fresh browser context (no cookies or storage from another test); its console messages
    are kept for the failure artifacts."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    console = request.node.stash.setdefault(CONSOLE, [])
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    page.on("pageerror", lambda error: console.append(f"uncaught: {error}"))
    yield page
    context.close()


@pytest.fixture
def open_notebook(page, jupyterlab: LabServer) -> Iterator[Callable]:
    """Open a notebook of the served copy by its path (`05_fencing.ipynb`); its kernel is shut down after
    the test."""
    from tests.browser.notebook_page import NotebookPage

    def open_(path: str) -> NotebookPage:
        return NotebookPage.open(page, jupyterlab, path, workspace=f"test-{uuid.uuid4().hex[:8]}")
    yield open_
    jupyterlab.shut_down_kernels()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep what a failed test's page showed: taken here, while the page and its kernel still live (fixture
    teardown comes after)."""
    report = yield
    if report.failed and report.when == "call" and "page" in item.funcargs:
        report.sections.append(("browser artifacts",
                                save_failure(item, item.funcargs["page"], item.funcargs.get("jupyterlab"))))
    return report


def save_failure(item: pytest.Item, page, lab: LabServer | None) -> str:
    """Save the screenshot, console log and JupyterLab log of a failed test; say where they went."""
    from playwright.sync_api import Error as PlaywrightError
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^\w.-]+", "_", item.name)
    saved = []
    (ARTIFACTS / f"{name}.console.txt").write_text("\n".join(item.stash.get(CONSOLE, [])) + "\n")
    saved.append(f"{name}.console.txt")
    if lab is not None:
        shutil.copyfile(lab.process.log_path, ARTIFACTS / f"{name}.jupyterlab.log")
        saved.append(f"{name}.jupyterlab.log")
    try:
        page.screenshot(path=ARTIFACTS / f"{name}.png")
        saved.append(f"{name}.png")
    except PlaywrightError as error:  # a crashed or closed page: the logs say more than nothing would
        saved.append(f"no screenshot ({error})")
    return f"in {ARTIFACTS}: " + ", ".join(saved)
