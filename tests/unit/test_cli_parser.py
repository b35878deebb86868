"""The command's parser takes its defaults from the dataclasses that define them, so the two cannot drift."""

from __future__ import annotations

import pytest

import reliableq_stages
from reliableq.bench.scenarios import SCENARIOS
from reliableq.charge.client import DEFAULT_TIMEOUT_SECONDS as CHARGE_TIMEOUT_SECONDS
from reliableq.charge.service import ChargeFaults
from reliableq.cli.arguments import UsageError, mechanisms_from, seconds_from
from reliableq.cli.main import build_parser
from reliableq.config import WorkerSettings
from reliableq.lab.chaos import ChaosConfig


def test_worker_chaos_and_charge_service_defaults_are_the_dataclasses_own():
    parse = build_parser().parse_args
    worker, settings = parse(["worker"]), WorkerSettings()
    assert (worker.concurrency, worker.lease, worker.poll, worker.charge_timeout, worker.grace) == (
        settings.concurrency, settings.lease_seconds, settings.poll_seconds, CHARGE_TIMEOUT_SECONDS,
        settings.shutdown_grace_seconds)
    chaos, config = parse(["chaos"]), ChaosConfig()
    assert (chaos.seed, chaos.jobs, chaos.workers, chaos.concurrency, chaos.lease, chaos.settle) == (
        config.seed, config.jobs, config.workers, config.concurrency, config.lease_seconds, config.settle_seconds)
    charge, faults = parse(["charge-service"]), ChargeFaults()
    assert (charge.latency, charge.transient_rate, charge.permanent_rate, charge.seed) == (
        faults.latency_seconds, faults.transient_rate, faults.permanent_rate, faults.seed)


def test_help_names_every_stage_and_every_bench_scenario():
    parser = build_parser()
    subcommands = parser._subparsers._group_actions[0].choices
    assert all(name in subcommands["stage"].format_help() for name in reliableq_stages.names())
    bench_help = " ".join(subcommands["bench"].format_help().split())
    assert all(name in bench_help.replace(" ", "") for name in SCENARIOS)


def test_a_wait_for_the_database_is_the_option_else_the_environment_else_the_default(monkeypatch):
    """`reliableq worker --db-wait` and RELIABLEQ_DB_WAIT (as `api --db-timeout` and RELIABLEQ_DB_TIMEOUT)."""
    assert build_parser().parse_args(["worker", "--db-wait", "0.5"]).db_wait == 0.5
    monkeypatch.delenv("RELIABLEQ_DB_WAIT", raising=False)
    assert seconds_from(None, "RELIABLEQ_DB_WAIT", 1.0) == 1.0
    monkeypatch.setenv("RELIABLEQ_DB_WAIT", "2.5")
    assert seconds_from(None, "RELIABLEQ_DB_WAIT", 1.0) == 2.5
    assert seconds_from(0.5, "RELIABLEQ_DB_WAIT", 1.0) == 0.5
    for bad in ("0", "-1", "nan", "inf", "soon", ""):
        monkeypatch.setenv("RELIABLEQ_DB_WAIT", bad)
        with pytest.raises(UsageError, match=f"^RELIABLEQ_DB_WAIT must be a positive number of seconds, got {bad!r}$"):
            seconds_from(None, "RELIABLEQ_DB_WAIT", 1.0)


def test_off_takes_a_mechanism_as_the_stages_spell_it_or_as_the_mechanisms_do():
    args = build_parser().parse_args(["demo", "--off", "skip-locked, commit_before_ack"])
    off = mechanisms_from(args)
    assert not off.skip_locked and not off.commit_before_ack and off.leases
    with pytest.raises(UsageError, match="unknown mechanism"):
        mechanisms_from(build_parser().parse_args(["demo", "--off", "skip-lock"]))
