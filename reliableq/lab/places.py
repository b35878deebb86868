"""Where the lab's files are: the notebooks it ships, and the learner's workspace.

One workspace per learner, whatever the current folder: the CLI, the notebooks' panels and `reliableq lab`
all use the folder `RELIABLEQ_WORKSPACE` names, else the `workspace/` folder of the clone (beside
`notebooks/`), else `~/reliableq-workspace` for a package installed without a clone. It holds the learner's
copies of the notebooks (JupyterLab serves it, so saving a notebook never changes the clone), their
exercise files, backups and progress, and a `.gitignore` that keeps it all out of the repository.

Benchmark results, for notebook 13: the learner's newest run (`results/bench/latest` in the clone), else
the reference results shipped in `notebooks/bench_reference/`; `RELIABLEQ_BENCH_RESULTS` names another.
"""

from __future__ import annotations

import os
from pathlib import Path

WORKSPACE_VARIABLE = "RELIABLEQ_WORKSPACE"
BENCH_RESULTS_VARIABLE = "RELIABLEQ_BENCH_RESULTS"
REFERENCE_BENCH_FOLDER = "notebooks/bench_reference"  # in the clone
_CLONE = Path(__file__).resolve().parents[2]  # this file: <clone>/reliableq/lab/places.py


def shipped_notebooks() -> Path:
    """The clone's notebooks/ folder, else ./notebooks."""
    beside_package = _CLONE / "notebooks"
    return beside_package if beside_package.is_dir() else Path.cwd() / "notebooks"


def workspace_folder() -> Path:
    """The learner's workspace (see the module's docstring)."""
    configured = os.environ.get(WORKSPACE_VARIABLE)
    if configured:
        return Path(configured).expanduser().resolve()
    if (_CLONE / "notebooks").is_dir() and (_CLONE / "pyproject.toml").is_file():
        return _CLONE / "workspace"
    return Path.home() / "reliableq-workspace"


def reference_bench_results(clone: Path = _CLONE) -> Path:
    """The benchmark results shipped with the notebooks (`reliableq bench --reference` writes them)."""
    return clone / REFERENCE_BENCH_FOLDER


def bench_runs(clone: Path = _CLONE) -> Path:
    """Where `reliableq bench` writes its runs, whatever the current folder: the clone's `results/bench/`
    (git ignores it), else ./results/bench for a package installed without a clone."""
    return clone / "results" / "bench" if (clone / "pyproject.toml").is_file() else Path.cwd() / "results" / "bench"


def bench_results(clone: Path = _CLONE) -> Path:
    """The results folder notebook 13 shows (see the module's docstring); it may hold no results."""
    configured = os.environ.get(BENCH_RESULTS_VARIABLE)
    if configured:
        return Path(configured).expanduser().resolve()
    own = bench_runs(clone) / "latest"
    return own if (own / "results.json").is_file() else reference_bench_results(clone)


def from_clone(path: Path) -> str:
    """`path` named from the clone's root when inside it, as the README names files; else in full."""
    return path.relative_to(_CLONE).as_posix() if path.is_relative_to(_CLONE) else path.as_posix()


def shown(path: Path) -> str:
    """`path` as a person reads it from here: relative to the current folder when inside it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()
