"""Chaos with a failover: real processes over a primary and a synchronous standby, the primary killed in
the middle of the submissions.

A `reliableq api` process, a `reliableq charge-service` process and worker processes run on one
multi-host URL over a pair (reliableq/standby.py); keyed clients submit over HTTP, each retrying a 503
or a dropped connection with the same Idempotency-Key, as a careful client does. A seed fixes the
schedule: after how many acknowledgements the link to the standby stalls (SIGSTOP: the standby lags),
how long it lags, and whether a worker process dies with the primary (SIGKILL; a supervisor starts
another once the standby is promoted). Then the primary is SIGKILLed and the standby promoted (`pg_ctl
promote`); the API and the workers find it by themselves; the clients carry on. Once every acknowledged
job the promoted server has is settled, every invariant is checked there, and one more: every charge is
for a job the queue still has. With sync_standby on nothing acknowledged is lost; off, the jobs
acknowledged during the lag are missing, named by their keys.

Measured: from the primary's death to the first 202 for a request sent after it, and to the first claim
on the promoted server (both on this machine's clock, which the servers share).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

from reliableq import scratch
from reliableq.config import Mechanisms
from reliableq.db import Databases
from reliableq.lab import invariants, processes
from reliableq.lab.harness import LocalSystem, local_system
from reliableq.lab.invariants import Check
from reliableq.lab.ledger import read_rows
from reliableq.standby import StandbyPair, start_pair

# A client's pause before it retries a refused or dropped submission: short, so the promoted server's
# first 202 is seen soon after it can be given; seeded jitter, so the clients do not retry in step.
RETRY_SECONDS = (0.05, 0.2)
# A client's pause between two jobs: the submissions span the failover, so some are sent after it.
THINK_SECONDS = (0.02, 0.15)


@dataclass(frozen=True)
class FailoverConfig:
    seed: int = 0
    clients: int = 4
    jobs_per_client: int = 25
    workers: int = 2
    lease_seconds: float = 2.0
    settle_seconds: float = 90.0
    mechanisms: Mechanisms = Mechanisms()


@dataclass(frozen=True)
class FailoverSchedule:
    cut_after: int  # acknowledgements before the link to the standby stalls
    lag_seconds: float  # how long the standby lags before the primary dies
    worker_killed: int | None  # the worker process that dies with the primary, if any


def failover_schedule(config: FailoverConfig) -> FailoverSchedule:
    """The schedule a seed implies: the same seed always gives the same one."""
    rng = random.Random(config.seed)
    total = config.clients * config.jobs_per_client
    return FailoverSchedule(cut_after=rng.randint(total // 5, total // 3), lag_seconds=round(rng.uniform(0.3, 1.0), 2),
                            worker_killed=rng.randrange(config.workers) if rng.random() < 0.5 else None)


@dataclass(frozen=True)
class Acknowledged:
    key: str
    job_id: uuid.UUID
    sent: float  # time.time() the acknowledged request was sent
    answered: float


@dataclass
class FailoverReport:
    config: FailoverConfig
    schedule: FailoverSchedule
    acknowledged: list[Acknowledged]
    refused: int  # submissions answered 503 or dropped, each retried with its key
    lost: list[str]  # keys of acknowledged jobs the promoted server does not have
    checks: list[Check]
    link_cut: float  # time.time()
    primary_died: float
    first_acknowledged_after_seconds: float | None
    first_claim_after_seconds: float | None
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.held for check in self.checks)

    def text(self) -> str:
        c, s = self.config, self.schedule
        killed = f", worker-{s.worker_killed} SIGKILLed with it" if s.worker_killed is not None else ""
        lines = [
            f"failover chaos seed={c.seed} clients={c.clients}x{c.jobs_per_client} workers={c.workers} "
            f"lease={c.lease_seconds:g}s ({c.mechanisms.describe()})",
            f"schedule: the link to the standby stalled after {s.cut_after} acknowledgements, the standby lagged "
            f"{s.lag_seconds:g}s, then the primary was SIGKILLed and the standby promoted{killed}",
            f"acknowledged {len(self.acknowledged)}, refused or dropped and retried with the same key "
            f"{self.refused}, in {self.seconds:.1f}s",
            "after the primary's death: first 202 in " + _seconds(self.first_acknowledged_after_seconds)
            + ", first claim on the promoted server in " + _seconds(self.first_claim_after_seconds),
            "invariants:",
            *(f"  {check.line()}" for check in self.checks),
        ]
        if self.lost:
            lines.append(f"LOST after the failover ({len(self.lost)}): {', '.join(self.lost)}")
        lines += self.notes
        lines.append("all invariants held" if self.ok else
                     "VIOLATED with seed " + f"{c.seed}: " + "; ".join(ch.name for ch in self.checks if not ch.held))
        return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}s"


class _Clients:
    """Keyed clients submitting over HTTP, each retrying its refused or dropped submissions with the same
    key until acknowledged. The run watches `acknowledged` grow to place the cut."""

    def __init__(self, config: FailoverConfig, api_url: str) -> None:
        self.config, self.api_url = config, api_url
        self.acknowledged: list[Acknowledged] = []
        self.refused = 0
        self.grown = asyncio.Event()  # set on each acknowledgement

    async def run(self) -> None:
        async with httpx.AsyncClient(base_url=self.api_url, timeout=10) as http:
            await asyncio.gather(*(self._client(http, n) for n in range(self.config.clients)))

    async def _client(self, http: httpx.AsyncClient, n: int) -> None:
        rng = random.Random(f"{self.config.seed}:{n}")
        for i in range(self.config.jobs_per_client):
            key = f"client-{n}-job-{i}"
            while True:
                sent = time.time()
                try:
                    response = await http.post("/v1/jobs", headers={"Idempotency-Key": key},
                                               json={"amount_cents": 1000 + 100 * n + i, "currency": "USD"})
                except httpx.TransportError:
                    response = None
                if response is not None and response.status_code == 202:
                    self.acknowledged.append(Acknowledged(key, uuid.UUID(response.json()["id"]), sent, time.time()))
                    self.grown.set()
                    await asyncio.sleep(rng.uniform(*THINK_SECONDS))
                    break
                if response is not None and response.status_code != 503:
                    raise RuntimeError(f"submission {key} answered {response.status_code}: {response.text}")
                self.refused += 1
                await asyncio.sleep(rng.uniform(*RETRY_SECONDS))

    async def wait_for(self, count: int) -> None:
        while len(self.acknowledged) < count:
            self.grown.clear()
            await self.grown.wait()


async def run_failover_chaos(config: FailoverConfig = FailoverConfig()) -> FailoverReport:
    schedule = failover_schedule(config)
    pair = await start_pair(synchronous=True)
    began = time.monotonic()
    try:
        with scratch.empty_database("rq_failover_charge") as charge_url, \
                tempfile.TemporaryDirectory(prefix="reliableq-failover-") as logs:
            databases = Databases(pair.url("rq_failover_queue"), charge_url)
            async with local_system(config.mechanisms, databases=databases, servers="processes",
                                    worker_pool_size=0, logs=Path(logs)) as system:
                return await _run(config, schedule, pair, system, began)
    finally:
        await asyncio.to_thread(pair.stop)


async def _run(config: FailoverConfig, schedule: FailoverSchedule, pair: StandbyPair, system: LocalSystem,
               began: float) -> FailoverReport:
    workers = [system.spawn_worker(f"worker-{n}", config.lease_seconds) for n in range(config.workers)]
    # Running before the first submission: the failover is meant to meet working workers. A worker still
    # starting when the seed's early cut and kill came (imports take seconds on a loaded machine) found no
    # writable server and exited, all three once in CI, and nothing settled.
    await asyncio.gather(*(processes.wait_running(worker, processes.READY_TIMEOUT_SECONDS) for worker in workers))
    clients = _Clients(config, system.api_url)
    submitting = asyncio.create_task(clients.run())
    try:
        await asyncio.wait_for(clients.wait_for(schedule.cut_after), config.settle_seconds)
        pair.link.cut()
        cut = time.time()
        await asyncio.sleep(schedule.lag_seconds)  # the lag itself: what it lets through is what is at stake
        pair.kill_primary()
        died = time.time()  # after the kill, every process of it gone: a request sent later reaches no primary
        if schedule.worker_killed is not None:
            workers[schedule.worker_killed].kill()
        await asyncio.to_thread(pair.promote)
        if schedule.worker_killed is not None:  # its supervisor starts another on the promoted server
            system.spawn_worker(f"worker-{schedule.worker_killed}-restarted", config.lease_seconds)
        await asyncio.wait_for(submitting, config.settle_seconds)
    finally:
        submitting.cancel()
    url = system.databases.queue_url
    promoted = {row["job_id"] for row in await read_rows(url, "lab_queue", "job_ids")}
    lost = [ack.key for ack in clients.acknowledged if ack.job_id not in promoted]
    await system.wait_settled([ack.job_id for ack in clients.acknowledged if ack.job_id in promoted],
                              timeout=config.settle_seconds)
    checks = await invariants.check_stored(system.databases, [ack.job_id for ack in clients.acknowledged])
    checks.append(await _charges_of_known_jobs(system.databases, promoted))
    after = [ack.answered - died for ack in clients.acknowledged if ack.sent > died]
    (claimed,) = await read_rows(url, "lab_queue", "job_first_claim_after",
                                 {"after": datetime.fromtimestamp(died, UTC)})
    first_claim = claimed["claimed_at"].timestamp() - died if claimed["claimed_at"] else None
    return FailoverReport(config, schedule, clients.acknowledged, clients.refused, lost, checks, cut, died,
                          min(after, default=None), first_claim, time.monotonic() - began)


async def _charges_of_known_jobs(databases: Databases, stored: set[uuid.UUID]) -> Check:
    """A charge for a job the promoted server does not have: the customer paid for work the queue forgot
    (a worker ran a job the primary alone had)."""
    rows = await read_rows(databases.charge_url, "lab_charge", "charge_counts_by_job")
    return Check("every charge is for a job the promoted server has",
                 [{"job_id": row["job_id"], "charges": row["charges"]} for row in rows
                  if row["charges"] and row["job_id"] not in stored])
