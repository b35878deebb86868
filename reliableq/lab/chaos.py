"""The seeded chaos suite: many jobs, several workers, crashes, long pauses and failures, then a check.

A seed fixes the whole fault schedule: which job (by submission order) meets which crash or pause, and
which charge requests fail; and whose each job is (one tenant floods the queue ahead of a few quiet ones).
Crashed workers are restarted, as a process supervisor would. Once every job has settled (or the settle
time ran out, or only jobs past their attempt budget are left) the invariants are checked directly in
PostgreSQL. With a mechanism switched off, the report names the invariant that broke. In-process workers
share one event loop, so a "pause" stalls one handler (its lease stops being renewed), not a whole process;
the real SIGSTOP and SIGKILL versions are `reliableq demo pause` and `reliableq demo kill9`.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

from reliableq.charge.service import ChargeFaults
from reliableq.config import DEFAULT_MAX_ATTEMPTS, Mechanisms
from reliableq.lab import invariants
from reliableq.lab.faults import CRASH_POINTS, FaultPlan
from reliableq.lab.harness import LocalSystem, fast_settings, local_system
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import SHIPPED, Pieces
from reliableq.lab.scenario import job_labels
from reliableq.lab.timeline import Event, collect
from reliableq.worker import WorkerStats

WORKER_CRASH_POINTS = CRASH_POINTS[:3]


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 0
    jobs: int = 120
    workers: int = 3
    concurrency: int = 4  # permits per worker
    lease_seconds: float = 1.0
    crash_rate: float = 0.05  # share of jobs whose worker crashes at one of the three crash points
    pause_rate: float = 0.08  # share of jobs whose handler stalls for longer than the lease
    api_crash_rate: float = 0.03  # share of submissions the API "crashes" on between 202 and commit
    poison_rate: float = 0.02  # share of jobs whose amount the charge service always declines
    transient_rate: float = 0.1  # share of charge requests answered 503
    permanent_rate: float = 0.02  # share of charge requests answered 422
    outage_seconds: float = 0.5  # the charge service is down this long once only in-flight jobs remain
    # Interleavings that only a held-back step forces (each kind is scheduled at least once when its
    # rate is positive, so every seed meets it): a success whose group commit is held back longer than
    # the lease; a slow handler whose first renewal is held inside its transaction past the lease (with
    # a fleet limit, it races the other workers' fleet claims); a finalize whose COMMIT answer is lost.
    slow_commit_rate: float = 0.03
    slow_renewal_rate: float = 0.03
    lost_answer_rate: float = 0.03
    fleet_limit: int | None = None  # jobs in flight across all workers; None: no fleet limit
    # Attempts each job may make. The outage meets the slowest jobs, which have spent some already: a
    # larger budget leaves them enough retries for the outage's requests to tell backoff from none.
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    # Whose jobs they are (tenant_mix): one tenant floods the queue, its jobs submitted first, then this many
    # quiet tenants submit a few jobs each. 0: every job is one tenant's (the exercise checker's runs).
    quiet_tenants: int = 3
    settle_seconds: float = 60.0  # how long the system may take to finish every job
    mechanisms: Mechanisms = Mechanisms()
    pieces: Pieces = SHIPPED  # a learner's queries or policy in place of the shipped ones (the exercises)


# The mechanisms whose absence a chaos run shows. It runs on one server: sync_standby needs a standby and a
# failover, which `reliableq chaos --failover` (reliableq/lab/failover_chaos.py) and its stage stage.
SHOWN_BY_CHAOS = tuple(name for name in Mechanisms.names() if name != "sync_standby")


FLOOD_TENANT = "flood"
QUIET_JOBS = (3, 8)  # each quiet tenant submits between this many jobs, both included


def tenant_mix(config: ChaosConfig) -> list[str]:
    """Each job's tenant, by submission order: the flood tenant's jobs first, then the quiet tenants' few
    jobs each (3 to 8, at most a quarter of the run between them), in an order the seed shuffles. Drawn
    from a random stream of its own, so the fault schedule of a seed is the same with tenants or without.
    First in, first out, the quiet tenants wait for the whole flood; the fair claim serves them at once."""
    rng = random.Random(f"tenant mix {config.seed}")
    quiet: list[str] = []
    room = config.jobs // 4
    for number in range(1, config.quiet_tenants + 1):
        jobs = min(rng.randint(*QUIET_JOBS), room - len(quiet))
        quiet += [f"quiet-{number}"] * max(jobs, 0)
    rng.shuffle(quiet)
    return [FLOOD_TENANT] * (config.jobs - len(quiet)) + quiet


@dataclass(frozen=True)
class ScheduledFault:
    job_index: int  # submission order
    action: str  # crash | pause | api_crash | poison
    point: str


def fault_schedule(config: ChaosConfig) -> list[ScheduledFault]:
    """The faults a seed implies, by job index: the same seed always gives the same schedule."""
    rng = random.Random(config.seed)
    bands = (("crash", config.crash_rate), ("pause", config.pause_rate), ("api_crash", config.api_crash_rate),
             ("poison", config.poison_rate), ("slow_commit", config.slow_commit_rate),
             ("slow_renewal", config.slow_renewal_rate), ("lost_answer", config.lost_answer_rate))
    by_index: dict[int, ScheduledFault] = {}
    for index in range(config.jobs):
        u = rng.random()
        point = rng.choice(WORKER_CRASH_POINTS)
        for action, rate in bands:
            if u < rate:
                by_index[index] = _scheduled(index, action, point, rng)
                break
            u -= rate
    # Every kind of fault with a rate at least once, on a job in the first half (a backlog is still there,
    # so other workers are claiming when it happens): a small run (the exercise checker's 40 jobs) would
    # otherwise often have no poison job, and its check of attempt budgets nothing that could break them.
    for action, rate in bands:
        if rate > 0 and all(f.action != action for f in by_index.values()):
            free = [i for i in range(max(config.jobs // 2, 1)) if i not in by_index]
            if free:
                index = rng.choice(free)
                by_index[index] = _scheduled(index, action, rng.choice(WORKER_CRASH_POINTS), rng)
    return [by_index[index] for index in sorted(by_index)]


def _scheduled(index: int, action: str, crash_point: str, rng: random.Random) -> ScheduledFault:
    point = {
        "crash": crash_point,
        # A pause where no transaction is open: the handler just stops renewing.
        "pause": rng.choice(WORKER_CRASH_POINTS[:2]) if action == "pause" else "",
        "api_crash": "after_ack_before_commit",
        "poison": "charge",
        "slow_commit": "before_group_commit",
        "slow_renewal": "during_renewal",
        "lost_answer": "after_finalize_commit",
    }[action]
    return ScheduledFault(index, action, point)


@dataclass
class ChaosReport:
    config: ChaosConfig
    schedule: list[ScheduledFault]
    checks: list[Check]
    job_ids: list[uuid.UUID]  # the acknowledged jobs, in submission order
    restarts: int
    settled: bool
    seconds: float
    status_counts: dict[str, int]
    events: list[Event] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(check.held for check in self.checks)

    @property
    def acknowledged(self) -> int:
        return len(self.job_ids)

    def label(self, job_id: uuid.UUID | str) -> str:
        """The job's name in this run's report: job-N, the Nth submitted (its ScheduledFault.job_index is N-1)."""
        return job_labels(self.job_ids)[str(job_id)]

    def shortest_broken_history(self) -> list[Event]:
        """The events of the offending job with the fewest events: the smallest story of the failure."""
        offenders = {str(v["job_id"]) for check in self.checks for v in check.violations if "job_id" in v}
        histories = [[e for e in self.events if e.job_id == job] for job in offenders]
        return min((h for h in histories if h), key=len, default=[])

    def text(self) -> str:
        c = self.config
        kinds = Counter(f.action for f in self.schedule)
        lines = [
            f"chaos seed={c.seed} jobs={c.jobs} workers={c.workers}x{c.concurrency} lease={c.lease_seconds:g}s "
            f"({c.mechanisms.describe()})",
            f"faults scheduled: {kinds.get('crash', 0)} worker crashes, {kinds.get('pause', 0)} pauses longer "
            f"than the lease, {kinds.get('api_crash', 0)} API crashes, {kinds.get('poison', 0)} poison jobs; "
            f"{kinds.get('slow_commit', 0)} group commits and {kinds.get('slow_renewal', 0)} renewals held back "
            f"past the lease, {kinds.get('lost_answer', 0)} lost COMMIT answers; "
            f"charge failures: {c.transient_rate:.0%} transient, {c.permanent_rate:.0%} permanent, "
            f"an outage of {c.outage_seconds:g}s" + (f"; fleet limit {c.fleet_limit}" if c.fleet_limit else ""),
            f"tenants: {_mix_said(tenant_mix(c))}",
            f"acknowledged {self.acknowledged}, worker restarts {self.restarts}, "
            f"{'settled' if self.settled else 'did NOT settle'} in {self.seconds:.1f}s; "
            + " ".join(f"{s}={n}" for s, n in self.status_counts.items()),
            "invariants:",
            *(f"  {check.line()}" for check in self.checks),
        ]
        if self.ok:
            lines.append("all invariants held")
        else:
            broken = [check.name for check in self.checks if not check.held]
            lines.append(f"VIOLATED with seed {c.seed}: " + "; ".join(broken))
            history = self.shortest_broken_history()
            if history:
                lines.append(f"shortest history that broke ({self.label(history[0].job_id)}):")
                lines += [f"  {e.seconds:8.3f}s  {e.worker:<24} {e.kind:<14} {e.detail}" for e in history]
        return "\n".join(lines)


async def run_chaos(config: ChaosConfig = ChaosConfig()) -> ChaosReport:
    schedule = fault_schedule(config)
    faults = FaultPlan()
    api_faults = FaultPlan()
    charge_faults = ChargeFaults(transient_rate=config.transient_rate, permanent_rate=config.permanent_rate,
                                 seed=config.seed)
    # A first retry window twice the outage: backing off means sitting most of it out.
    backoff_base = max(2 * config.outage_seconds, 0.05)
    settings = fast_settings(concurrency=config.concurrency, lease_seconds=config.lease_seconds,
                             backoff_seed=config.seed, backoff_base_seconds=backoff_base,
                             backoff_max_seconds=2 * backoff_base,
                             fleet_limit=config.fleet_limit)
    charge_timeout = max(1.0, config.lease_seconds)
    started_wall = None
    async with local_system(config.mechanisms, charge_faults, api_faults, database_prefix="rq_chaos",
                            worker_pool_size=_worker_pool_size(config), pieces=config.pieces) as system:
        started_wall = await system.queue.database_now()
        by_index = {f.job_index: f for f in schedule}
        api_crash_calls = [i for i, f in sorted(by_index.items()) if f.action == "api_crash"]
        # The API's fault point sees job ids it has not returned yet, so it is armed by call order.
        _arm_api_crashes(api_faults, api_crash_calls)
        poison_amount = charge_faults.decline_over_cents + 1
        tenants = tenant_mix(config)
        acknowledged = [await system.submit_http(poison_amount if _is(by_index, index, "poison") else 1000 + index,
                                                 max_attempts=config.max_attempts, tenant=tenants[index])
                        for index in range(config.jobs)]
        for index, fault in by_index.items():
            if fault.action not in ("api_crash", "poison"):
                _arm(faults, fault, _for_job(acknowledged[index]), config.lease_seconds * 1.6)
        # Every submission stored (or lost to an API crash) before the first claim, so that the fairness
        # check knows from when each first-time job was surely waiting for every claim's snapshot. With
        # commit_before_ack off an acknowledged job is stored just after its 202.
        await system.wait_until(_submissions_landed(system, api_faults, config.jobs), config.settle_seconds,
                                "every submission to be stored")
        visible_from = await system.queue.database_now()
        began = time.monotonic()
        stop = asyncio.Event()
        supervisors = [asyncio.create_task(_supervise(system, settings, charge_timeout, faults, slot, stop))
                       for slot in range(config.workers)]
        settled = True
        try:
            if config.outage_seconds > 0:
                # Once no more than one claim of every worker is left to claim, so that an immediate retry
                # has little to queue behind, and while jobs still run into it: by the time the last
                # in-flight jobs are seen finished, their charges are done (a small run met no request
                # in its outage at all, so nothing could show retries that do not back off).
                in_flight = config.workers * config.concurrency
                await system.wait_until(_terminal_at_least(system, max(config.jobs - 2 * in_flight, 0)),
                                        config.settle_seconds, "the backlog to drain")
                charge_faults.start_outage(config.outage_seconds)
            # A run whose only unsettled jobs are past their attempt budget has its verdict (with
            # dead-lettering off they retry forever): waiting out the settle time would add a minute to it.
            settled = await system.wait_settled(timeout=config.settle_seconds,
                                                give_up=system.only_jobs_past_their_budget_unsettled)
            # A stalled handler that outlived its lease resumes after the job settled: let its
            # (stale) finalize happen before judging, or fencing would never be put to the test.
            await system.wait_until(_no_pause(faults), config.lease_seconds * 3, "paused handlers to resume")
        except TimeoutError:
            settled = False
        stop.set()
        results = await asyncio.gather(*supervisors)
        seconds = time.monotonic() - began
        peaks = [peak for slot in results for peak in slot.peaks]
        checks = await invariants.check_stored(system.databases, acknowledged, enforce_budget=True)
        checks.append(invariants.capacity_check(peaks, config.concurrency))
        checks.append(await invariants.fairness_check(system.databases, config.workers, visible_from))
        if config.outage_seconds > 0:
            checks.append(await invariants.outage_check(system.databases))
        if config.fleet_limit is not None:
            checks.append(await invariants.fleet_limit_check(system.databases, config.fleet_limit))
        accounts = {worker: stats.__dict__ for slot in results for worker, stats in slot.accounts.items()}
        if config.mechanisms.leases:
            too_slow = [(job, worker) for worker, stats in accounts.items() for job in stats["ran_out_unrenewed"]]
            checks.append(await invariants.lease_loss_check(system.databases, faults.triggered, too_slow))
        checks.append(await invariants.accounts_check(system.databases, accounts))
        events = await collect(system.databases, started_wall, [faults, api_faults])
        status_counts = await system.queue.counts()
    return ChaosReport(config, schedule, checks, acknowledged, sum(slot.restarts for slot in results),
                       settled, seconds, status_counts, events)


def _arm(faults: FaultPlan, fault: ScheduledFault, job_filter, hold_seconds: float) -> None:
    """Arm one scheduled worker fault on its job; every hold lasts longer than the lease."""
    if fault.action == "crash":
        faults.arm_crash(fault.point, job_filter=job_filter)
    elif fault.action == "lost_answer":
        faults.arm_lost_answer(fault.point, job_filter=job_filter)
    else:
        if fault.action == "slow_renewal":
            # Slow work, its lease renewed meanwhile, outlasting the held renewal: a renewal happens, is
            # held back, and commits while the handler still works.
            faults.arm_pause("during_effect", seconds=2 * hold_seconds, job_filter=job_filter)
        faults.arm_pause(fault.point, seconds=hold_seconds, job_filter=job_filter)


def _worker_pool_size(config: ChaosConfig) -> int:
    """Room for every worker's claim and group commit and a good share of its handlers' renewals and
    finalizes at once, within what the server allows (100 connections by default), so a run with many
    permits waits briefly for connections instead of aborting on a pool timeout."""
    return min(config.workers * (config.concurrency + 2), 60)


def _is(by_index: dict[int, ScheduledFault], index: int, action: str) -> bool:
    return index in by_index and by_index[index].action == action


def _terminal_at_least(system: LocalSystem, jobs: int):
    async def check() -> bool:
        counts = await system.queue.counts()
        return counts["SUCCEEDED"] + counts["DEAD"] >= jobs
    return check


def _mix_said(tenants: list[str]) -> str:
    jobs = Counter(tenants)
    quiet = [f"{tenant} {jobs[tenant]}" for tenant in sorted(jobs) if tenant != FLOOD_TENANT]
    return f"{FLOOD_TENANT} {jobs[FLOOD_TENANT]} jobs first" + (", then " + ", ".join(quiet) if quiet else "")


def _submissions_landed(system: LocalSystem, api_faults: FaultPlan, jobs: int):
    async def check() -> bool:
        lost = sum(1 for fault in api_faults.triggered if fault.action == "crash")
        return sum((await system.queue.counts()).values()) + lost >= jobs
    return check


def _no_pause(faults: FaultPlan):
    async def check() -> bool:
        return faults.pauses_in_progress == 0
    return check


def _for_job(job_id: uuid.UUID):
    return lambda job: getattr(job, "id", None) == job_id


def _arm_api_crashes(api_faults: FaultPlan, call_indexes: list[int]) -> None:
    calls = iter(range(10**9))
    targets = set(call_indexes)
    api_faults.arm_crash("after_ack_before_commit", times=len(targets),
                         job_filter=lambda _job_id: next(calls) in targets)


@dataclass
class _SlotResult:
    restarts: int = 0
    peaks: list[int] = field(default_factory=list)  # each worker's in-flight peak
    accounts: dict[str, WorkerStats] = field(default_factory=dict)  # by worker id; crashed workers left out


async def _supervise(system: LocalSystem, settings, charge_timeout: float, faults: FaultPlan, slot: int,
                     stop: asyncio.Event) -> _SlotResult:
    """Run one worker slot, restarting its worker after each crash, until told to stop."""
    result, generation = _SlotResult(), 0
    while True:
        worker = system.worker(settings.with_id(f"chaos-{slot}.{generation}"), faults,
                               charge_timeout_seconds=charge_timeout)
        task = system.start_worker(worker)
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            worker.request_stop()
        stats = await task
        stopper.cancel()
        result.peaks.append(stats.in_flight_peak)
        if stats.crashed_at is None:
            # A crashed worker's account ends mid-flight (its handlers were cut off); only whole ones count.
            result.accounts[worker.worker_id] = stats
        if stats.crashed_at is None or stop.is_set():
            return result
        result.restarts += 1
        generation += 1
