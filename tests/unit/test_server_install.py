"""An install for serving jobs (`pip install .`, the Docker image's) has none of the lab's extras. Its
commands must still load: the API, the worker, the charge service and the operator commands; the
exercises say which packages they need instead of a traceback. Checked in a fresh interpreter where the
extras cannot be imported, as on such an install."""

from __future__ import annotations

import subprocess
import sys

# The `lab` and `dev` extras' top-level modules (pyproject.toml).
EXTRAS = ("hypothesis", "pglast", "jupyterlab", "ipywidgets", "pandas", "matplotlib", "playwright", "schemathesis")

WITHOUT_EXTRAS = f"""
import sys
from importlib.abc import MetaPathFinder

class NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
# What the serving commands import when they run (they import it there, not when the CLI loads).
import reliableq.api, reliableq.worker, reliableq.charge.service, reliableq.cli.services
from reliableq.cli import main
sys.exit(main(sys.argv[1:]))
"""


def reliableq_without_extras(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS, *args], capture_output=True, text=True,
                          timeout=60)


def test_the_commands_that_serve_jobs_load_without_the_lab():
    result = reliableq_without_extras("--help")
    assert result.returncode == 0, result.stderr
    assert all(command in result.stdout for command in ("api", "worker", "charge-service", "submit", "replay"))


def test_the_exercises_name_the_missing_package_in_one_line():
    result = reliableq_without_extras("exercise", "list")
    assert result.returncode == 2
    assert result.stderr.strip() == ("reliableq: error: the exercises need the lab's packages (hypothesis is "
                                     "missing): pip install 'reliableq[lab]'")
