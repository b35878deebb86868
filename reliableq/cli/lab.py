"""`reliableq demo`, `stage`, `lab` and `chaos`: the lab's stories, stages, notebooks and chaos suite."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from reliableq import db
from reliableq.cli.arguments import UsageError, check_fleet_limit, mechanisms_from, run_coroutine


def cmd_demo(args: argparse.Namespace) -> int:
    from reliableq.lab import demo
    if args.story == "crash":
        result = run_coroutine(demo.crash_after_charge(mechanisms_from(args)))
    elif args.off:
        raise UsageError("--off applies to the in-process demo only; kill9 and pause run the full system")
    elif args.story == "kill9":
        result = run_coroutine(demo.kill9(args.lease or 2.0))
    else:
        result = run_coroutine(demo.pause(args.lease or 1.0))
    print(result.report())
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    import stages
    from reliableq.lab.scenario import ScenarioParams, wrap
    try:
        stage = stages.get(args.name)
    except LookupError as error:
        raise UsageError(str(error)) from None
    params = ScenarioParams(seed=args.seed)
    runs = [False, True] if args.mode == "compare" else [args.mode == "on"]
    print("\n".join(wrap([f"stage {stage.NAME}: {stage.FAILURE}", f"invariant: {stage.INVARIANT}"])))
    for on in runs:
        result = run_coroutine(stage.scenario(on, params))
        print(f"\n{result.report()}")
    return 0


def notebooks_dir() -> Path:
    """The checkout's notebooks/ folder (the package sits beside it), else ./notebooks."""
    beside_package = Path(__file__).resolve().parents[2] / "notebooks"  # this file: reliableq/cli/lab.py
    return beside_package if beside_package.is_dir() else Path.cwd() / "notebooks"


def trust_notebooks(folder: Path) -> None:
    """Sign the lab's own notebooks for this user: JupyterLab renders the saved pictures of the panels
    (HTML) as written only in trusted notebooks, and sanitised otherwise."""
    import nbformat
    from nbformat.sign import NotebookNotary
    notary = NotebookNotary()
    for path in sorted(folder.glob("*.ipynb")):
        notary.sign(nbformat.read(path, nbformat.NO_CONVERT))


def cmd_lab(args: argparse.Namespace) -> int:
    folder = Path(args.notebooks) if args.notebooks else notebooks_dir()
    if not folder.is_dir():
        raise UsageError(f"no notebooks folder at {folder}; pass --notebooks DIR")
    databases = db.resolve()
    db.migrate(databases)
    trust_notebooks(folder)
    # Kernels inherit the environment: every notebook then uses this server, embedded or not.
    env = os.environ | {"DATABASE_URL": databases.queue_url, "CHARGE_DATABASE_URL": databases.charge_url}
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={folder}", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={args.port}", "--ServerApp.port_retries=0"]
    if args.no_browser:
        command.append("--no-browser")
    if os.geteuid() == 0:
        command.append("--allow-root")  # JupyterLab refuses root without it (containers, CI machines)
    if args.token is not None:
        command.append(f"--IdentityProvider.token={args.token}")
    print(f"JupyterLab on http://127.0.0.1:{args.port} with notebooks in {folder}; database "
          f"{db.database_name(databases.queue_url)}. Ctrl-C stops it.", flush=True)
    # Become JupyterLab (exec), so SIGTERM and Ctrl-C reach it rather than orphaning it.
    os.execve(sys.executable, command, env)


def cmd_chaos(args: argparse.Namespace) -> int:
    from reliableq.lab.chaos import ChaosConfig, run_chaos
    mechanisms = mechanisms_from(args)
    check_fleet_limit(args.fleet_limit, mechanisms)
    config = ChaosConfig(seed=args.seed, jobs=args.jobs, workers=args.workers, concurrency=args.concurrency,
                         lease_seconds=args.lease, settle_seconds=args.settle, fleet_limit=args.fleet_limit,
                         mechanisms=mechanisms)
    report = run_coroutine(run_chaos(config))
    print(report.text())
    return 0 if report.ok else 1
