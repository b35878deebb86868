"""nbval runs these notebooks in kernels that inherit this environment: their exercise panels write the
starters into a workspace of the test run's own, never the developer's, and notebook 13 shows the benchmark
results shipped with it, as it was saved, whatever the developer's own last run (reliableq/lab/places.py)."""

import os
import tempfile
from pathlib import Path

import pytest

from reliableq.lab.places import BENCH_RESULTS_VARIABLE, WORKSPACE_VARIABLE, reference_bench_results

os.environ.setdefault(WORKSPACE_VARIABLE, tempfile.mkdtemp(prefix="reliableq-test-workspace-"))
os.environ[BENCH_RESULTS_VARIABLE] = str(reference_bench_results(Path(__file__).resolve().parents[1]))


def pytest_collection_modifyitems(items):
    """A notebook runs its stages end to end: slow, left out of the inner loop (`-m "not slow"`)."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing cell's report carries what it printed this time: nbval names an unexpected stream
    ("Unexpected output fields from running code: {'stderr'}") but not its text, which is the clue."""
    outcome = yield
    report = outcome.get_result()
    fresh = getattr(item, "test_outputs", None)
    if report.failed and fresh:
        for output in fresh:
            if output.get("output_type") == "stream":
                report.sections.append((f"this run's {output['name']}", output["text"]))
