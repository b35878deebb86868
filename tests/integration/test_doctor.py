"""`reliableq doctor` as a learner runs it the day before: a subprocess against the real PostgreSQL the
other CLI tests use (embedded unless DATABASE_URL is set), one line per check, exit 0 only if all passed.

The memory and disk checks read this machine: they pass where the tests can run at all (2 GB free of each)."""

from __future__ import annotations

import json
import re

import pytest

from reliableq.servers import free_port
from tests.integration.test_cli import reliableq

CHECKS = ["Python", "install", "database", "stage", "JupyterLab", "memory", "disk"]


def checks_named(stdout: str) -> list[str]:
    return [re.match(r"^[✓✗–] ([^:]+):", line).group(1) for line in stdout.splitlines()]


@pytest.mark.slow
def test_skip_stage_passes_every_check_but_the_stage():
    """Every check but the stage's is run, in order, and passes: one ✓ line each, exit 0."""
    result = reliableq("doctor", "--skip-stage")
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(line.startswith("✓ ") for line in result.stdout.splitlines()), result.stdout
    assert checks_named(result.stdout) == [c for c in CHECKS if c != "stage"], result.stdout
    assert re.search(r"^✓ database: PostgreSQL \d+", result.stdout, re.MULTILINE), result.stdout


@pytest.mark.slow
def test_a_closed_database_port_fails_the_database_line_with_its_fix():
    """A DATABASE_URL whose port nothing listens on: the database line is ✗ and says what to do, the stage
    that needs it is not run, the other checks still report, and the exit is 1."""
    closed = f"postgresql://nobody@127.0.0.1:{free_port()}/nothing"
    result = reliableq("doctor", env={"DATABASE_URL": closed})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = dict(zip(checks_named(result.stdout), result.stdout.splitlines(), strict=True))
    assert list(lines) == CHECKS, result.stdout
    assert re.match(r"^✗ database: .+ — fix: cannot connect to PostgreSQL .*Check DATABASE_URL", lines["database"])
    assert lines["stage"] == "✗ stage: not run: it needs the database — fix: fix the database line first"
    assert [name for name, line in lines.items() if line.startswith("✗")] == ["database", "stage"], result.stdout


@pytest.mark.slow
def test_json_lists_every_check_with_its_outcome():
    """--json prints only a JSON list: every check, in order, each {check, ok, detail, fix}."""
    result = reliableq("doctor", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checks = json.loads(result.stdout)
    assert [c["check"] for c in checks] == CHECKS
    assert all(set(c) == {"check", "ok", "detail", "fix"} for c in checks), checks
    assert all(c["ok"] is True and c["detail"] and c["fix"] is None for c in checks), checks


@pytest.mark.slow
def test_the_full_run_reports_how_long_the_stage_took():
    """Without --skip-stage a real stage runs end to end (API, worker, charge service) and its line says
    in how many seconds."""
    result = reliableq("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert checks_named(result.stdout) == CHECKS, result.stdout
    assert all(line.startswith("✓ ") for line in result.stdout.splitlines()), result.stdout
    assert re.search(r"^✓ stage: commit-before-ack ran end to end in \d+\.\d s \(4 jobs, the guarantee held\)$",
                     result.stdout, re.MULTILINE), result.stdout
