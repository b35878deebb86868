"""`reliableq demo`, `stage`, `lab` and `chaos`: the lab's stories, stages, notebooks and chaos suite."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from reliableq import db
from reliableq.cli.arguments import UsageError, check_fleet_limit, mechanisms_from, run_coroutine
from reliableq.lab.places import WORKSPACE_VARIABLE, shipped_notebooks


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
    import reliableq_stages
    from reliableq.lab.scenario import ScenarioParams, wrap
    try:
        stage = reliableq_stages.get(args.name)
    except LookupError as error:
        raise UsageError(str(error)) from None
    params = ScenarioParams(seed=args.seed)
    runs = [False, True] if args.mode == "compare" else [args.mode == "on"]
    print("\n".join(wrap([f"stage {stage.NAME}: {stage.FAILURE}", f"invariant: {stage.INVARIANT}"])))
    for on in runs:
        result = run_coroutine(stage.scenario(on, params))
        print(f"\n{result.report()}")
    return 0


def trust_notebooks(folder: Path) -> None:
    """Sign the notebooks in `folder` (the learner's copies of the lab's own) for this user: JupyterLab
    renders the saved pictures of the panels (HTML) as written only in trusted notebooks, and sanitised
    otherwise."""
    import nbformat
    from nbformat.sign import NotebookNotary
    notary = NotebookNotary()
    for path in sorted(folder.glob("*.ipynb")):
        notary.sign(nbformat.read(path, nbformat.NO_CONVERT))


def cmd_lab(args: argparse.Namespace) -> int:
    from reliableq.lab.exercises.workspace import Workspace
    shipped = Path(args.notebooks) if args.notebooks else shipped_notebooks()
    if not shipped.is_dir():
        raise UsageError(f"no notebooks folder at {shipped}; pass --notebooks DIR")
    workspace = Workspace(Path(args.workspace) if args.workspace else None)
    databases = db.resolve()
    db.migrate(databases)
    # JupyterLab serves the learner's workspace, with their own copies of the notebooks: saving one (or
    # JupyterLab's autosave) never changes the clone, and the exercise files sit beside the notebooks.
    copied, stale = workspace.copy_notebooks(shipped, fresh=args.fresh_notebooks)
    trust_notebooks(workspace.folder)
    # Kernels inherit the environment: every notebook then uses this workspace, and the server this command
    # found (DATABASE_URL as the user set it, or none: the same embedded server, so a notebook's banner
    # says which the learner chose).
    # JupyterLab's terminals find `reliableq` too: this interpreter's scripts folder first on PATH (so a
    # learner who ran the venv's `reliableq lab` without activating it has it), and a shell that is not a
    # login shell, which JupyterLab starts whenever its own output is not a terminal and whose /etc/profile
    # would reset PATH.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    env = os.environ | {WORKSPACE_VARIABLE: str(workspace.folder), "PATH": path}
    shell = os.environ.get("SHELL") or shutil.which("sh") or "/bin/sh"
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={workspace.folder}",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={args.port}", "--ServerApp.port_retries=0",
               f"--ServerApp.terminado_settings=shell_command={shlex.quote(shell)}"]
    if args.no_browser:
        command.append("--no-browser")
    if os.geteuid() == 0:
        command.append("--allow-root")  # JupyterLab refuses root without it (containers, CI machines)
    if args.token is not None:
        command.append(f"--IdentityProvider.token={args.token}")
    if copied:
        print(f"Copied {len(copied)} notebook(s) from {shipped} into your workspace.")
    if stale:
        print(f"Kept your copies of {', '.join(stale)}, though the clone's changed since: "
              "`reliableq lab --fresh-notebooks` backs yours up and copies the new ones.")
    print(f"JupyterLab on http://127.0.0.1:{args.port} with your workspace {workspace.folder}; database "
          f"{db.database_name(databases.queue_url)}. Ctrl-C stops it.", flush=True)
    # JupyterLab's terminals open in its working folder unless asked for another: the workspace (a full path,
    # so a relative --workspace still names it from there), where the learner's notebooks and exercise files
    # are, not wherever this command was started.
    os.chdir(workspace.folder)
    # Become JupyterLab (exec), so SIGTERM and Ctrl-C reach it rather than orphaning it.
    os.execve(sys.executable, command, env)


def cmd_chaos(args: argparse.Namespace) -> int:
    from reliableq.lab.chaos import ChaosConfig, run_chaos
    mechanisms = mechanisms_from(args)
    if args.failover:
        from reliableq.lab.failover_chaos import FailoverConfig, run_failover_chaos
        failover = run_coroutine(run_failover_chaos(FailoverConfig(
            seed=args.seed, workers=args.workers, lease_seconds=args.lease, settle_seconds=args.settle,
            mechanisms=mechanisms)))
        print(failover.text())
        return 0 if failover.ok else 1
    check_fleet_limit(args.fleet_limit, mechanisms)
    config = ChaosConfig(seed=args.seed, jobs=args.jobs, workers=args.workers, concurrency=args.concurrency,
                         lease_seconds=args.lease, settle_seconds=args.settle, fleet_limit=args.fleet_limit,
                         mechanisms=mechanisms)
    report = run_coroutine(run_chaos(config))
    print(report.text())
    return 0 if report.ok else 1
