"""The `reliableq` command as a person runs it: its exit code, stdout and stderr. A subprocess where the
process is the point (servers, signals, a pipe closed early, the demos, a refusal from the installed
command); its `main` in this process for the rest (in_process: the same code, without a second's import).

Errors must be one line on stderr and a non-zero exit, never a traceback; the operator commands work
against the databases DATABASE_URL and CHARGE_DATABASE_URL name."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from reliableq import db
from reliableq.api import create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.cli.main import main
from reliableq.lab.scenario import LINE_WIDTH
from reliableq.lab.waiting import wait_until
from reliableq.servers import LoopbackServer, free_port

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing"


def reliableq(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reliableq", *args], env=os.environ | (env or {}),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def database_env(databases: db.Databases) -> dict[str, str]:
    return {"DATABASE_URL": databases.queue_url, "CHARGE_DATABASE_URL": databases.charge_url}


def assert_one_line_error(result: subprocess.CompletedProcess, exit_code: int | None = None) -> str:
    """The command failed with exactly one line saying `error` on stderr and no traceback; returns it."""
    shown = f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode != 0, shown
    if exit_code is not None:
        assert result.returncode == exit_code, shown
    assert "Traceback" not in result.stderr, shown
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, shown
    return errors[0]


# -- the demo --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_reader_that_stops_early_ends_the_output_quietly():
    """`reliableq stage naive off | head -1`: once the reader is gone the command stops, no traceback."""
    command = subprocess.Popen([sys.executable, "-m", "reliableq", "stage", "naive", "off"],
                               env=os.environ | {"PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert command.stdout.readline().startswith("stage naive")
    command.stdout.close()  # as head does after its line; the stage's results are still to come
    _, stderr = command.communicate(timeout=60)
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert command.returncode == 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped


@pytest.mark.slow
def test_demo_shows_one_charge_for_two_runs():
    """`reliableq demo` crashes a worker after its charge and recovers: A=2 H=2 C=1 F=1."""
    result = reliableq("demo")
    assert result.returncode == 0, result.stderr
    assert "A=2 H=2 C=1 F=1" in result.stdout, result.stdout
    assert "the guarantee held" in result.stdout


@pytest.mark.slow
def test_demo_without_idempotency_shows_two_charges():
    """`reliableq demo --off idempotency` shows the same crash charging the job twice."""
    result = reliableq("demo", "--off", "idempotency")
    assert result.returncode == 0, result.stderr
    assert "C=2" in result.stdout, result.stdout
    assert "the guarantee broke" in result.stdout


# -- stages ---------------------------------------------------------------------------------------

def run_blocks(stdout: str, first_line: str) -> list[list[str]]:
    """The output's lines per run: from each line starting with `first_line` to the next."""
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(first_line)]
    return [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)], strict=True)]


@pytest.mark.slow
def test_stage_compare_prints_a_verdict_the_table_and_the_measurements_per_run():
    """`reliableq stage fencing compare`: per run, short verdict lines, the A/H/C/F table, then the
    measurements. Both runs expect C=2 until idempotency; only the off run claims F=2 for fencing."""
    result = reliableq("stage", "fencing", "compare")
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= LINE_WIDTH, result.stdout
    assert result.stdout.startswith("stage fencing: a paused worker wakes")
    blocks = run_blocks(result.stdout, "Stage 05 fencing with fencing ")
    assert len(blocks) == 2, result.stdout
    expected = "Expected at this stage: C=2 remains until idempotency (stage 06) makes the charge idempotent."
    for lines, switch, finalized in zip(blocks, ("off", "on"), (2, 1), strict=True):
        table = lines.index("job    status     A  H  C  F")
        verdict, rows, rest = unwrapped(lines[:table]), lines[table + 1:table + 5], lines[table + 5:]
        assert verdict[0].startswith(f"Stage 05 fencing with fencing {switch}; "), result.stdout
        assert verdict[1] == "Seed 1, 4 jobs: 4 SUCCEEDED."
        assert verdict[2].startswith("The guarantee broke: job-1, job-2, job-3, job-4 were charged 2 times")
        assert verdict[-2:] == [expected, ""]  # a blank line before the table
        assert ("This stage's failure: F=2, which fencing fixes." in verdict) == (switch == "off")
        assert rows == [f"job-{i}  SUCCEEDED  2  2  2  {finalized}" for i in range(1, 5)]
        refused = 4 if switch == "on" else 0
        assert rest[:4] == ["", "Measured:", f"  stale_finalizes_won={4 - refused}",
                            f"  stale_finalizes_refused={refused}"]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    sample = re.search(r"`reliableq stage fencing on`:\n\n```\n(.*?)```", readme, re.DOTALL).group(1)
    # The README shows the on run's verdict as printed, up to the line before the table's blank one.
    assert sample.splitlines() == blocks[1][:blocks[1].index("")]


def unwrapped(lines: list[str]) -> list[str]:
    """Printed lines with each wrapped continuation (indented four spaces) joined to the line it continues."""
    joined: list[str] = []
    for line in lines:
        if line.startswith("    ") and joined:
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    return joined


@pytest.mark.slow
def test_stage_that_holds_says_so_and_expects_nothing():
    """`reliableq stage naive on`: the guarantee held, nothing is expected of a later stage."""
    result = reliableq("stage", "naive", "on")
    assert result.returncode == 0, result.stderr
    (lines,) = run_blocks(result.stdout, "Stage 01 naive")
    assert lines[:4] == ["Stage 01 naive, no mechanism of its own; all mechanisms off.",
                         "Seed 1, 4 jobs: 4 SUCCEEDED.", "The guarantee held.", ""]
    assert lines[5:9] == [f"job-{i}  SUCCEEDED  1  1  1  1" for i in range(1, 5)]
    assert "Expected at this stage" not in result.stdout and "failure:" not in "\n".join(lines)


# -- bad input ------------------------------------------------------------------------------------

def in_process(args: list[str], capsys, monkeypatch, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`reliableq ARGS` run by its `main` in this process (a second's import saved per command), with the
    exit code and output a subprocess would give, against the databases `env` names (default: an
    unreachable one). For the commands whose process proves nothing more than their `main` does."""
    for variable, value in (env or {"DATABASE_URL": UNREACHABLE}).items():
        monkeypatch.setenv(variable, value)
    try:
        code = main(args)
    except SystemExit as exited:  # argparse's own refusals exit
        code = exited.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["reliableq", *args], code, out.out, out.err)


@pytest.fixture
def command(databases, capsys, monkeypatch):
    """`reliableq ARGS` in this process, against the test's databases (in_process)."""
    return lambda *args: in_process(list(args), capsys, monkeypatch, database_env(databases))


def test_submit_through_an_api_that_wants_a_token(databases, capsys, monkeypatch):
    """--api-url with the token from --token or RELIABLEQ_API_TOKEN stores the job through the API (the
    database itself is unreachable from the command); without it, one line with the API's 401."""
    server = LoopbackServer(create_api_app(databases.queue_url, api_token="s3cret", kinds=STANDARD_KINDS))
    url = server.start()
    try:
        refused = in_process(["submit", "--amount", "500", "--api-url", url], capsys, monkeypatch)
        by_option = in_process(["submit", "--amount", "500", "--api-url", url, "--token", "s3cret"],
                               capsys, monkeypatch)
        monkeypatch.setenv("RELIABLEQ_API_TOKEN", "s3cret")
        by_variable = in_process(["submit", "--amount", "700", "--api-url", url], capsys, monkeypatch)
    finally:
        server.stop()
    assert "401" in assert_one_line_error(refused, exit_code=2)
    assert by_option.returncode == 0 and by_variable.returncode == 0, (by_option, by_variable)
    with psycopg.connect(databases.queue_url) as conn:
        stored = dict(conn.execute("SELECT id::text, (payload->>'amount_cents')::int FROM jobs").fetchall())
    assert stored == {by_option.stdout.strip(): 500, by_variable.stdout.strip(): 700}


def test_a_server_says_when_it_listens_and_when_it_stops(databases):
    """A real charge-service process, SIGTERMed once it answers: exit 0, and its log says both ends of its
    life (the API and the worker log the same way: one _serve, the worker's own test in test_processes)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "reliableq", "charge-service", "--port", str(port)],
                              env=os.environ | database_env(databases), stdin=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return server.poll() is not None  # exited: the assertions below show why
        asyncio.run(wait_until(answers, 30, "the charge service to answer"))
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=30)
    finally:
        server.kill()
    assert server.returncode == 0, stderr
    assert f"charge service listening on http://127.0.0.1:{port}" in stderr and "charge service stopped" in stderr


def test_a_bad_argument_fails_with_one_line_from_the_real_command():
    """A real `reliableq` process given a command that does not exist: exit 2, one `error` line, no traceback."""
    result = reliableq("frobnicate", env={"DATABASE_URL": UNREACHABLE})
    assert assert_one_line_error(result, exit_code=2).startswith("reliableq")


@pytest.mark.parametrize("args", [
    pytest.param(["frobnicate"], id="unknown-subcommand"),
    pytest.param(["demo", "--off", "bogus"], id="unknown-mechanism"),
    pytest.param(["worker", "--concurrency", "0"], id="zero-concurrency"),
    pytest.param(["replay", "not-a-uuid"], id="replay-not-a-uuid"),
    pytest.param(["submit", "--amount", "-5"], id="negative-amount"),
    pytest.param(["submit"], id="charge-without-amount"),
    pytest.param(["submit", "--kind", "mystery"], id="unknown-kind"),
    pytest.param(["worker", "--grace", "-1"], id="negative-grace"),
    pytest.param(["worker", "--lease", "nan"], id="nan-lease"),
    pytest.param(["worker", "--db-wait", "0"], id="zero-db-wait"),
    pytest.param(["api", "--db-timeout", "-1"], id="negative-db-timeout"),
    pytest.param(["chaos", "--fleet-limit", "2", "--off", "leases"], id="fleet-limit-without-leases"),
    pytest.param(["chaos", "--fleet-limit", "0"], id="zero-fleet-limit"),
    pytest.param(["api", "--idempotency-window", "0"], id="zero-idempotency-window"),
    pytest.param(["charge-service", "--retry-after", "soon"], id="retry-after-not-seconds"),
])
def test_bad_arguments_fail_with_one_line(args, capsys, monkeypatch):
    """Bad arguments exit 2 with one `error` line on stderr and no traceback, before any database is asked
    (it is unreachable). Run by `main` in this process: the test above shows the real command does the same."""
    line = assert_one_line_error(in_process(args, capsys, monkeypatch), exit_code=2)
    assert line.startswith("reliableq")


@pytest.mark.parametrize(("args", "says"), [
    (["worker", "--poll", "abc"], "argument --poll: must be a positive number, got abc"),
    (["prune", "--older-than", "1w"], "argument --older-than: must be zero or a positive number, got 1w"),
    (["api", "--port", "http"], "argument --port: must be a TCP port between 1 and 65535, got http"),
    (["charge-service", "--transient-rate", "most"], "argument --transient-rate: must be between 0 and 1, got most"),
])
def test_a_value_that_is_not_a_number_is_refused_saying_what_was_expected(args, says, capsys, monkeypatch):
    """Not argparse's own "invalid <function name> value", which names our code rather than the option's rule."""
    line = assert_one_line_error(in_process(args, capsys, monkeypatch), exit_code=2)
    assert line.endswith(says)


@pytest.mark.parametrize(("command", "variable"), [("worker", "RELIABLEQ_DB_WAIT"), ("api", "RELIABLEQ_DB_TIMEOUT"),
                                                   ("api", "RELIABLEQ_IDEMPOTENCY_WINDOW")])
def test_a_bad_seconds_variable_in_the_environment_fails_with_one_line(command, variable, capsys, monkeypatch):
    """Seconds set in the environment, not a positive number: one line naming the variable, exit 2,
    before any connection is tried."""
    monkeypatch.setenv(variable, "soon")
    line = assert_one_line_error(in_process([command], capsys, monkeypatch), exit_code=2)
    assert line == f"reliableq: error: {variable} must be a positive number of seconds, got 'soon'"


def test_unreachable_database_fails_with_one_clear_line():
    """`reliableq jobs` against an unreachable database exits 1 with one line naming the problem."""
    result = reliableq("jobs", env={"DATABASE_URL": UNREACHABLE})
    line = assert_one_line_error(result, exit_code=1)
    assert "cannot connect to PostgreSQL" in line
    assert "DATABASE_URL" in line
    assert result.stdout == ""


# -- operating the queue --------------------------------------------------------------------------

def test_submit_then_show_the_job(command):
    """`submit` prints the new job's id and `jobs show ID` prints it as JSON with its history."""
    submitted = command("submit", "--amount", "1250", "--max-attempts", "3")
    assert submitted.returncode == 0, submitted.stderr
    job_id = uuid.UUID(submitted.stdout.strip())

    shown = command("jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert job["id"] == str(job_id)
    assert job["status"] == "PENDING"
    assert job["payload"] == {"amount_cents": 1250, "currency": "USD"}
    assert job["max_attempts"] == 3
    assert job["idempotency_key"] == f"reliableq:charge:{job_id}"
    assert job["attempts"] == 0 and job["attempt_history"] == []
    assert [e["event"] for e in job["events"]] == ["submitted"]
    assert job["kind"] == "charge"

    noop = command("submit", "--kind", "noop")
    assert noop.returncode == 0, noop.stderr
    shown = json.loads(command("jobs", "show", noop.stdout.strip()).stdout)
    assert (shown["kind"], shown["payload"]) == ("noop", {})

    listed = command("jobs")
    assert listed.returncode == 0, listed.stderr
    assert "PENDING=2" in listed.stdout and "more jobs" not in listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert lines[str(job_id)].endswith("attempts=0/3  charge 12.50 USD")
    assert lines[shown["id"]].endswith("attempts=0/5  noop")


def test_jobs_says_on_stderr_when_more_exist_than_its_limit(databases, command):
    """`jobs --limit N` prints the N newest jobs, one line each; when there are more it says so on stderr."""
    with psycopg.connect(databases.queue_url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, 3)")
    limited = command("jobs", "--limit", "2")
    assert limited.returncode == 0, limited.stderr
    assert len(limited.stdout.splitlines()) == 3  # the counts, then two jobs
    assert "more jobs than --limit 2" in limited.stderr


def test_show_unknown_job_fails_with_one_line(command):
    """`jobs show` of an id that does not exist exits 2 with one line naming the id."""
    missing = uuid.uuid4()
    result = command("jobs", "show", str(missing))
    line = assert_one_line_error(result, exit_code=2)
    assert str(missing) in line


def test_replay_refuses_a_job_that_is_not_dead(command):
    """`replay ID` of a PENDING job exits 2, says only DEAD jobs can be replayed, and changes nothing."""
    submitted = command("submit", "--amount", "1250")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()

    result = command("replay", job_id)
    line = assert_one_line_error(result, exit_code=2)
    assert "PENDING" in line
    assert "only DEAD jobs can be replayed" in line
    assert json.loads(command("jobs", "show", job_id).stdout)["events"][-1]["event"] == "submitted"


async def test_replay_sends_a_dead_job_back_to_pending(databases, make_queue, submission):
    """`replay ID` of a DEAD job puts it back to PENDING with the same key and a fresh budget."""
    queue = make_queue()
    job = await queue.submit(submission(max_attempts=1))
    (claimed,) = await queue.claim(1, "test-worker", 5.0)
    assert await queue.dead(claimed, "permanent failure: card rejected")

    result = reliableq("replay", str(job.id), "--budget", "2", env=database_env(databases))
    assert result.returncode == 0, result.stderr
    assert f"replayed {job.id}" in result.stdout
    replayed = await queue.get(job.id)
    assert replayed.status == "PENDING"
    assert replayed.max_attempts == replayed.attempts + 2
    assert replayed.idempotency_key == job.idempotency_key
