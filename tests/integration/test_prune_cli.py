"""`reliableq prune`: one pass prints what it deleted; `--every` keeps pruning until SIGTERM; bad
arguments are refused with one line before the database is asked."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from reliableq.cli.main import main
from reliableq.lab.waiting import wait_until
from tests.integration.test_cli import UNREACHABLE, database_env
from tests.repository.test_retention import DAY, history, remaining


@pytest.mark.parametrize("args, named", [
    (["--older-than", "-1"], "--older-than"), (["--older-than", "soon"], "--older-than"), ([], "--older-than"),
    (["--older-than", "60", "--batch", "0"], "--batch"), (["--older-than", "60", "--batch", "10001"], "batch"),
    (["--older-than", "60", "--every", "0"], "--every"),
    (["--older-than", "60", "--idempotency-window", "nan"], "--idempotency-window")])
def test_bad_arguments_are_refused_with_one_line(args, named, capsys, monkeypatch):
    """Refused (exit 2) with one `error` line naming the option, without connecting anywhere."""
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)
    try:
        code = main(["prune", *args])
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 2 and len(errors) == 1 and named in errors[0], errors


def test_a_bad_window_variable_is_refused_with_one_line(capsys, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", UNREACHABLE)
    monkeypatch.setenv("RELIABLEQ_IDEMPOTENCY_WINDOW", "-5")
    assert main(["prune", "--older-than", "60"]) == 2
    assert "RELIABLEQ_IDEMPOTENCY_WINDOW must be a positive number" in capsys.readouterr().err


def test_one_pass_prints_what_it_deleted(databases, capsys, monkeypatch):
    """Old SUCCEEDED and DEAD jobs; without --dead only the SUCCEEDED go, with it the DEAD too."""
    asyncio.run(history(databases.queue_url, "SUCCEEDED", 7, 2 * DAY))
    asyncio.run(history(databases.queue_url, "DEAD", 3, 2 * DAY))
    for name, value in database_env(databases).items():
        monkeypatch.setenv(name, value)
    assert main(["prune", "--older-than", "3600", "--batch", "5"]) == 0
    assert capsys.readouterr().out == "pruned 7 jobs (7 SUCCEEDED, 0 DEAD) in 2 batches\n"
    assert main(["prune", "--older-than", "3600", "--dead"]) == 0
    assert capsys.readouterr().out == "pruned 3 jobs (0 SUCCEEDED, 3 DEAD) in 1 batch\n"


async def test_every_prunes_pass_after_pass_until_sigterm(databases, tmp_path):
    """`--every` runs a pass, waits, runs another: jobs that became old meanwhile go at the next pass;
    SIGTERM ends it with exit 0."""
    url = databases.queue_url
    await history(url, "SUCCEEDED", 4, 2 * DAY)
    output = tmp_path / "prune.out"
    with output.open("w") as stdout:
        process = subprocess.Popen([sys.executable, "-m", "reliableq", "prune", "--older-than", "3600",
                                    "--every", "0.2"], env=os.environ | database_env(databases),
                                   stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        async def first_pass_done() -> bool:
            return "pruned 4 jobs" in output.read_text()
        await wait_until(first_pass_done, 30, "the first pass to prune the first 4 jobs")
        later = await history(url, "SUCCEEDED", 6, 2 * DAY)

        async def later_ones_gone() -> bool:
            return not later & (await remaining(url))["jobs"]
        await wait_until(later_ones_gone, 30, "a later pass to prune the 6 jobs inserted after the first")
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "pruned 6 jobs" in output.read_text()
