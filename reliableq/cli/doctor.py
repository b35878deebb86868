"""`reliableq doctor`: what a learner runs the day before a workshop, so that a broken machine is found
while there is time to fix it. Each check is one small function returning a Check; `cmd_doctor` prints
each as one line (`✓ what: detail`, or `✗ what: what is wrong — fix: the command or step`) or, with
--json, all of them as a JSON list, and exits 1 if any failed.

Boundary: a passing doctor says this machine ran each piece once, now; not that it will stay fast under
a room's load, nor that the notebooks' saved outputs match (`python -m pytest notebooks` checks those).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import reliableq_stages
from reliableq import db
from reliableq.cli.arguments import run_coroutine
from reliableq.lab.scenario import ScenarioParams

# README's install command: the fix for anything missing from the environment.
INSTALL = "python -m pip install -e '.[dev]'"
# The modules the notebooks and exercises import: psycopg and the lab extra of pyproject.toml (a test holds
# the two together). The dev extra's (nbval, pytest, ...) only test the lab, so a learner can do without.
LAB_MODULES = ("psycopg", "jupyterlab", "ipywidgets", "pandas", "matplotlib", "hypothesis")
# A stage that runs every part end to end (API over HTTP, worker, charge service, PostgreSQL). Naive,
# commit-before-ack and skip-locked each took 1.1 s in-process (leases and fencing 1 s more); this one, with
# its mechanism on, takes the API's real path: the insert commits before the 202.
STAGE = "commit-before-ack"
STAGE_TIMEOUT_SECONDS = 120.0  # a stage takes seconds; two minutes means something is stuck, not slow
JUPYTERLAB_TIMEOUT_SECONDS = 60.0  # `jupyterlab --version` takes about 2 s; its first run may build caches
# Where pip installs pyproject's shared-data entry for reliableq/lab/jupyterlab_overrides.json.
OVERRIDES = Path("share/jupyter/lab/settings/overrides.d/reliableq.json")
GB = 10**9
# A notebook's kernel holds about 200 MB once it has run a stage and drawn its charts (190 MB measured),
# and JupyterLab and PostgreSQL need room beside a day's worth of them.
MEMORY_NEEDED = 2 * GB
# The embedded server's data folder: the schemas' templates and each run's scratch databases (dropped
# afterwards, but a killed run's linger until the next run clears them), plus its write-ahead log.
DISK_NEEDED = 2 * GB


@dataclass(frozen=True)
class Check:
    """One check's outcome, as printed and as --json gives it."""

    check: str  # what was checked: "Python", "install", "database", ...
    ok: bool | None  # None: not checked on this system, which neither passes nor fails the run
    detail: str  # what was found, or what is wrong
    fix: str | None = None  # a failed check's command or step that fixes it


def check_python() -> Check:
    minimum = minimum_python(required_python())
    found = ".".join(map(str, sys.version_info[:3]))
    wanted = ".".join(map(str, minimum))
    if sys.version_info[:len(minimum)] >= minimum:
        return Check("Python", True, f"{found} (the lab needs {wanted} or later)")
    return Check("Python", False, f"{found} is older than the {wanted} the lab needs",
                 f"install Python {wanted} or later, then make the environment with it: python{wanted} -m venv .venv "
                 f"&& . .venv/bin/activate && {INSTALL}")


def required_python() -> str:
    """requires-python from the checkout's pyproject.toml, else from the installed package's metadata."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"  # this file: reliableq/cli/doctor.py
    if pyproject.is_file():
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "reliableq":  # the checkout's, not some other project's the package sits in
            return project["requires-python"]
    return importlib.metadata.metadata("reliableq")["Requires-Python"]


def minimum_python(requires: str) -> tuple[int, ...]:
    """The lower bound of a requires-python specifier (">=3.11" -> (3, 11))."""
    bound = re.search(r">=\s*(\d+(?:\.\d+)*)", requires)
    if bound is None:
        raise ValueError(f"requires-python {requires!r} has no lower bound (>=)")
    return tuple(int(part) for part in bound.group(1).split("."))


def check_install() -> Check:
    try:
        version = importlib.metadata.version("reliableq")
    except importlib.metadata.PackageNotFoundError:
        return Check("install", False, "reliableq is not installed in this Python's environment",
                     f"in the checkout, with the environment activated: {INSTALL}")
    missing = []
    for module in LAB_MODULES:
        try:
            importlib.import_module(module)
        except Exception:  # a broken install raises what it likes (a compiled part's OSError, a RuntimeError)
            missing.append(module)
    if missing:
        return Check("install", False, f"cannot import {', '.join(missing)}",
                     f"in the checkout, with the environment activated: {INSTALL}")
    return Check("install", True, f"reliableq {version}; {', '.join(LAB_MODULES)} import")


def check_database() -> Check:
    try:
        databases = db.resolve()
        db.migrate(databases)
        with db.connect(databases.queue_url) as conn:
            # What `SHOW server_version` says: the server reports it when a connection starts.
            version = conn.info.parameter_status("server_version")
    except db.DatabaseUnavailable as error:
        return Check("database", False, f"cannot use {database_place()}", str(error))
    return Check("database", True, f"PostgreSQL {version} ({database_place()}); databases "
                                   f"{db.database_name(databases.queue_url)} and "
                                   f"{db.database_name(databases.charge_url)} migrated")


def database_place() -> str:
    if os.environ.get("DATABASE_URL"):
        return "the server DATABASE_URL names"
    return f"the embedded PostgreSQL in {db.embedded_data_dir()}"


def check_stage() -> Check:
    started = time.monotonic()
    try:
        scenario = reliableq_stages.get(STAGE).scenario(True, ScenarioParams(seed=1))
        result = run_coroutine(asyncio.wait_for(scenario, STAGE_TIMEOUT_SECONDS))
    except TimeoutError:
        return Check("stage", False, f"{STAGE} did not finish within {STAGE_TIMEOUT_SECONDS:g} s",
                     "close programs you do not need and run reliableq doctor again; if it is still stuck, run "
                     f"`reliableq --debug stage {STAGE} on` and show the instructor its output")
    except db.DatabaseUnavailable as error:
        return Check("stage", False, f"{STAGE} could not reach the database", str(error))
    seconds = time.monotonic() - started
    if result.violations():
        return Check("stage", False, f"{STAGE} ran in {seconds:.1f} s, but {'; '.join(result.violations())}",
                     f"run `reliableq stage {STAGE} on` and show the instructor its output")
    return Check("stage", True,
                 f"{STAGE} ran end to end in {seconds:.1f} s ({len(result.jobs)} jobs, the guarantee held)")


def check_jupyterlab() -> Check:
    try:
        run = subprocess.run([sys.executable, "-m", "jupyterlab", "--version"], capture_output=True, text=True,
                             timeout=JUPYTERLAB_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Check("JupyterLab", False,
                     f"`python -m jupyterlab --version` took over {JUPYTERLAB_TIMEOUT_SECONDS:g} s",
                     f"in the checkout, with the environment activated: {INSTALL}")
    if run.returncode != 0:
        said = (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
        return Check("JupyterLab", False, f"`python -m jupyterlab --version` failed: {said}",
                     f"in the checkout, with the environment activated: {INSTALL}")
    version = run.stdout.strip()
    installed = Path(sys.prefix) / OVERRIDES
    shipped = Path(__file__).resolve().parents[1] / "lab" / "jupyterlab_overrides.json"
    if not installed.is_file():
        return Check("JupyterLab", False, f"{version} runs, but the lab's settings are not in {installed}",
                     f"reinstall, in the checkout: {INSTALL}")
    # An editable install copies the file once: a later change to the lab's settings needs a reinstall.
    if json.loads(installed.read_text()) != json.loads(shipped.read_text()):
        return Check("JupyterLab", False, f"{version} runs, but {installed} differs from the lab's settings",
                     f"reinstall, in the checkout: {INSTALL}")
    return Check("JupyterLab", True, f"{version}, the lab's settings in {installed}")


def check_memory() -> Check:
    need = f"a day of notebooks needs {MEMORY_NEEDED / GB:g} GB free (each kernel takes about 200 MB)"
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except FileNotFoundError:
        return Check("memory", None, f"not checked: no /proc/meminfo on this system; {need}")
    available = re.search(r"^MemAvailable:\s+(\d+) kB$", meminfo, re.MULTILINE)
    if available is None:  # Linux before 3.14
        return Check("memory", None, f"not checked: /proc/meminfo has no MemAvailable; {need}")
    free = int(available.group(1)) * 1024
    if free < MEMORY_NEEDED:
        return Check("memory", False, f"{free / GB:.1f} GB available; {need}",
                     f"close programs you will not use during the day until {MEMORY_NEEDED / GB:g} GB is free, then "
                     "run reliableq doctor again; in the room, shut down the kernels of notebooks you have finished")
    return Check("memory", True, f"{free / GB:.1f} GB available; {need}")


def check_disk() -> Check:
    folder = db.embedded_data_dir().parent
    existing = next(p for p in (folder, *folder.parents) if p.exists())  # made by the first database start
    free = shutil.disk_usage(existing).free
    need = f"the database's data needs {DISK_NEEDED / GB:g} GB free"
    if free < DISK_NEEDED:
        return Check("disk", False, f"{free / GB:.1f} GB free where the database keeps its data ({folder}); {need}",
                     f"free {DISK_NEEDED / GB:g} GB on that disk, or set RELIABLEQ_DATA_DIR to a folder on a disk "
                     "with room")
    return Check("disk", True, f"{free / GB:.1f} GB free in {folder}; {need}")


def run_checks(skip_stage: bool, debug: bool) -> Iterator[Check]:
    """The checks in order, each as soon as it is done (a stage takes seconds; a first database start more)."""
    yield guarded("Python", check_python, debug)
    yield guarded("install", check_install, debug)
    database = guarded("database", check_database, debug)
    yield database
    if not skip_stage:
        if database.ok:
            yield guarded("stage", check_stage, debug)
        else:
            yield Check("stage", False, "not run: it needs the database", "fix the database line first")
    yield guarded("JupyterLab", check_jupyterlab, debug)
    yield guarded("memory", check_memory, debug)
    yield guarded("disk", check_disk, debug)


def guarded(what: str, check: Callable[[], Check], debug: bool) -> Check:
    """`check`'s outcome, or a failed check if it raised: one broken piece must not hide the others' lines."""
    try:
        return check()
    except Exception as error:
        if debug:
            raise
        reason = " ".join(str(error).split()) or type(error).__name__
        return Check(what, False, f"the check itself failed: {reason}",
                     "run `reliableq --debug doctor` and show the instructor its output")


def line(check: Check) -> str:
    if check.ok is None:
        return f"– {check.check}: {check.detail}"
    if check.ok:
        return f"✓ {check.check}: {check.detail}"
    return f"✗ {check.check}: {check.detail} — fix: {check.fix}"


def cmd_doctor(args: argparse.Namespace) -> int:
    checks = []
    for check in run_checks(args.skip_stage, args.debug):
        checks.append(check)
        if not args.json:
            print(line(check), flush=True)
    if args.json:
        print(json.dumps([asdict(check) for check in checks], ensure_ascii=False, indent=2))
    return 1 if any(check.ok is False for check in checks) else 0
