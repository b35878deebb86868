"""The command's parser takes its defaults from the dataclasses that define them, so the two cannot drift."""

from __future__ import annotations

import stages
from reliableq.bench.scenarios import SCENARIOS
from reliableq.charge.service import ChargeFaults
from reliableq.cli.main import build_parser
from reliableq.config import WorkerSettings
from reliableq.lab.chaos import ChaosConfig


def test_worker_chaos_and_charge_service_defaults_are_the_dataclasses_own():
    parse = build_parser().parse_args
    worker, settings = parse(["worker"]), WorkerSettings()
    assert (worker.concurrency, worker.lease, worker.poll, worker.charge_timeout, worker.grace) == (
        settings.concurrency, settings.lease_seconds, settings.poll_seconds, settings.charge_timeout_seconds,
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
    assert all(name in subcommands["stage"].format_help() for name in stages.names())
    bench_help = " ".join(subcommands["bench"].format_help().split())
    assert all(name in bench_help.replace(" ", "") for name in SCENARIOS)
