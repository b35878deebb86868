"""How a stage's scenario is run: the stages' shared vocabulary (Stage, Prediction, their order) and the
experiment a scenario composes from the harness, the fault plan and the queue.

A stage (`stages/sNN_*.py`) declares one mechanism and the failure it stops; its scenario runs inside
`experiment(...)` and returns a `ScenarioResult` (reliableq/lab/scenario.py: what it takes and what it
recorded, and how that reads). This module stages no failure itself and holds no queue logic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg

from reliableq import db, sql
from reliableq.charge.service import ChargeFaults
from reliableq.config import DEFAULT_MAX_ATTEMPTS, Mechanisms, WorkerSettings
from reliableq.lab import timeline
from reliableq.lab.faults import FaultPlan
from reliableq.lab.harness import LocalSystem, fast_settings, local_system
from reliableq.lab.invariants import Check
from reliableq.lab.ledger import JobCounts
from reliableq.lab.scenario import LOST, ScenarioParams, ScenarioResult, job_labels, stage_mechanisms
from reliableq.payload import DEFAULT_TENANT, Submission
from reliableq.worker import Worker

_LAB_Q = sql.queries("lab_queue")
_JOB_NAMESPACE = uuid.UUID("5b0c6a52-53f4-4e0b-9a4b-6f1d1f6c2a10")


@dataclass(frozen=True)
class Prediction:
    """A stage's "predict, then run" question. It lives with the stage, not in the notebook, so that the
    answer is not printed right above the question."""

    question: str
    options: Sequence[str]
    answer: str
    why: str  # shown after the learner checks, right or wrong

    def __post_init__(self) -> None:
        if self.answer not in self.options:
            raise ValueError(f"the answer {self.answer!r} is not one of the options")


STAGE_KNOBS = ("crash_point", "failure_rate")  # ScenarioParams that only some stages' stories read


class Stage(Protocol):
    """What a stage module provides (see stages/)."""

    NAME: str
    MECHANISM: str | None
    FAILURE: str
    INVARIANT: str
    PREDICTION: Prediction
    # The stage-specific ScenarioParams its story reads (of STAGE_KNOBS); every stage reads the others.
    OWN_KNOBS: tuple[str, ...]

    def mechanisms(self, on: bool) -> Mechanisms: ...

    async def scenario(self, on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult: ...


def index_stages(stages: Sequence[Stage]) -> dict[str, Stage]:
    """Name -> stage, checking the stages are naive first and then one per mechanism, in order."""
    declared = [stage.MECHANISM for stage in stages]
    if declared != [None, *Mechanisms.names()]:
        raise ValueError(f"stages must be naive then {', '.join(Mechanisms.names())}; got {declared}")
    return {stage.NAME: stage for stage in stages}


async def compare(stage: Stage, params: ScenarioParams = ScenarioParams()) -> tuple[ScenarioResult, ScenarioResult]:
    """The stage's scenario with its mechanism off, then on. One after the other, not concurrently:
    each run owns its databases, and timing measurements must not compete for the CPU."""
    off = await stage.scenario(False, params)
    on = await stage.scenario(True, params)
    return off, on


@dataclass
class Experiment:
    """One scenario run in progress: a LocalSystem plus what the result will need."""

    stage: str
    mechanism: str | None
    on: bool
    params: ScenarioParams
    system: LocalSystem
    started: datetime
    submitted: list[uuid.UUID] = field(default_factory=list)  # in order, whether stored or not
    fault_plans: list[FaultPlan] = field(default_factory=list)
    noted: list[timeline.Event] = field(default_factory=list)  # the story's own moments: a cut, a kill
    log_labels: _JobLabels = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.log_labels = _JobLabels(self.submitted)

    @property
    def mechanisms(self) -> Mechanisms:
        return self.system.mechanisms

    def seconds(self) -> float:
        """Seconds since the experiment began, on the clock the timeline uses."""
        return round((datetime.now(UTC) - self.started).total_seconds(), 4)

    def note(self, lane: str, kind: str, detail: str, job_id: uuid.UUID | None = None,
             at: datetime | None = None) -> None:
        """A moment of the scenario's own story on its timeline, in `lane` ("api", "database", a tenant): now,
        or `at` (a time PostgreSQL recorded)."""
        seconds = self.seconds() if at is None else round((at - self.started).total_seconds(), 4)
        self.noted.append(timeline.Event(seconds, str(job_id or ""), lane, None, kind, detail))

    def faults(self) -> FaultPlan:
        """A fault plan for workers, included in the timeline."""
        plan = FaultPlan()
        self.fault_plans.append(plan)
        return plan

    def settings(self, worker_id: str, **overrides: Any) -> WorkerSettings:
        return fast_settings(lease_seconds=self.params.lease_seconds, concurrency=self.params.concurrency,
                             backoff_seed=self.params.seed, worker_id=worker_id, **overrides)

    def worker(self, worker_id: str, faults: FaultPlan | None = None, **overrides: Any) -> Worker:
        return self.system.worker(self.settings(worker_id, **overrides), faults)

    async def submit(self, max_attempts: int = DEFAULT_MAX_ATTEMPTS, jobs: int | None = None,
                     tenant: str = DEFAULT_TENANT) -> list[uuid.UUID]:
        """Insert `jobs` jobs (default `params.jobs`) of `tenant` straight into the queue, one commit each (so
        each is due a moment after the one before), with ids derived from the seed so that the charge
        service's seeded draws and the backoff jitter repeat run after run."""
        first, ids = len(self.submitted), []
        for i in range(first, first + (self.params.jobs if jobs is None else jobs)):
            job_id = uuid.uuid5(_JOB_NAMESPACE, f"{self.stage}/{self.params.seed}/{i}")
            submission = Submission({"amount_cents": 1000 + i, "currency": "USD"}, max_attempts, kind="charge",
                                    tenant=tenant)
            await self.system.submit_direct(submission, job_id)
            ids.append(job_id)
        self._submitted(ids)
        return ids

    async def submit_http(self, amount_cents: int = 1250) -> uuid.UUID:
        """Submit one job through the API; the id is the client's receipt, stored or not."""
        job_id = await self.system.submit_http(amount_cents)
        self._submitted([job_id])
        return job_id

    def _submitted(self, ids: Sequence[uuid.UUID]) -> None:
        self.submitted.extend(ids)
        self.log_labels.log_held()

    async def wait_for(self, condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
        await self.system.wait_until(condition, timeout, what)

    @asynccontextmanager
    async def jobs_held(self, ids: Sequence[uuid.UUID]) -> AsyncIterator[None]:
        """The jobs' rows locked by a session of the experiment's own, as another claim would hold them,
        until the block ends."""
        async with await psycopg.AsyncConnection.connect(self.system.databases.queue_url) as conn:
            async with conn.transaction(force_rollback=True):
                await conn.execute(_LAB_Q["lab_hold_jobs"], {"ids": list(ids)})
                yield

    async def lock_waiters(self) -> int:
        """How many sessions of the queue's database wait for a lock now."""
        async with self.system.queue.pool.connection() as conn:
            return (await (await conn.execute(_LAB_Q["lab_lock_waiters"])).fetchone())[0]

    async def wait_settled(self, ids: Sequence[uuid.UUID], timeout: float = 20.0) -> None:
        """Until every job in `ids` is SUCCEEDED or DEAD (a stage's runs are short: 20 s is plenty)."""
        await self.system.wait_settled(ids, timeout)

    async def result(self, measurements: dict[str, Any] | None = None,
                     stage_checks: Sequence[Check] = ()) -> ScenarioResult:
        """Stop the workers (in-flight handlers finish within their grace), then read what was recorded.
        `stage_checks`: the stage's own invariant checked on this run, where it is not the guarantee."""
        watched = self.seconds()
        await self.system.stop_workers()
        recorded = {c.job_id: c for c in await self.system.counts()}
        jobs = [recorded.pop(job_id, None) or JobCounts(job_id, LOST, 0, 0, 0, 0, 0) for job_id in self.submitted]
        jobs.extend(recorded.values())  # anything stored that the scenario did not submit itself
        events = timeline.in_order([*await timeline.collect(self.system.databases, self.started,
                                                            [self.system.api_faults, *self.fault_plans]),
                                    *self.noted])
        return ScenarioResult(self.stage, self.mechanism, self.on, self.mechanisms, self.params, jobs, events,
                              measurements or {}, watched, list(stage_checks))


def arm_crash_all(plan: FaultPlan, point: str, handlers: int) -> None:
    """Crash a worker at `point` once all `handlers` of its jobs are there. The first arrivals wait
    (for an event never set); the last crashes the worker, which cancels the waiting ones. A plain
    arm_crash would kill the worker at the first arrival and cut the others off mid-charge, leaving
    H and C to chance."""
    if handlers > 1:
        plan.arm_pause(point, until=asyncio.Event(), times=handlers - 1)
    plan.arm_crash(point)


@asynccontextmanager
async def experiment(stage: str, mechanism: str | None, on: bool, params: ScenarioParams,
                     charge_faults: ChargeFaults | None = None,
                     databases: db.Databases | None = None) -> AsyncIterator[Experiment]:
    """A fresh LocalSystem with the stage's mechanisms; its scratch databases are dropped on exit.
    `databases`: run on these instead (migrated, left for their owner to remove)."""
    mechanisms = params.mechanisms or stage_mechanisms(mechanism, on)
    async with local_system(mechanisms, charge_faults, databases=databases, database_prefix="rq_stage",
                            pieces=params.pieces) as system:
        run = Experiment(stage, mechanism, on, params, system, datetime.now(UTC))
        for name in CORE_LOGGERS:
            logging.getLogger(name).addFilter(run.log_labels)
        try:
            yield run
        finally:
            for name in CORE_LOGGERS:
                logging.getLogger(name).removeFilter(run.log_labels)
            run.log_labels.log_held()


CORE_LOGGERS = ("reliableq.worker", "reliableq.api")  # the core's loggers a learner reads during a run


class _JobLabels(logging.Filter):
    """Names a run's jobs in the core's log lines as its tables and charts do (job-1, ...), not by id.
    A filter on each logger, because a logger's filters see only the records logged on it.

    A line can name a job before the run knows its id: the API logs a crash after its 202 went out,
    on its own thread, while the client may not have read that 202 yet. Such a line is held back
    and logged once the run learns the id, so it names the job as the table will; a line whose ids the
    run never learns is logged as it was when the run ends."""

    def __init__(self, submitted: list[uuid.UUID]) -> None:
        super().__init__()
        self.submitted = submitted  # the run's list, which grows as it submits
        self.held: list[logging.LogRecord] = []
        self.lock = threading.Lock()  # the API logs on its server's thread, the run learns ids on its own

    def filter(self, record: logging.LogRecord) -> bool:
        with self.lock:
            labels = job_labels(self.submitted)
            args = record.args if isinstance(record.args, tuple) else ()
            if any(isinstance(arg, uuid.UUID) and str(arg) not in labels for arg in args):
                self.held.append(record)
                return False
        message = record.getMessage()
        for job_id, label in labels.items():
            message = message.replace(f"job {job_id}", label).replace(job_id, label)
        record.msg, record.args = message, ()
        return True

    def log_held(self) -> None:
        """Log each held line again. With the filter on, those whose ids the run now knows pass, named,
        and the rest are held again; once it is off (the run has ended), all pass as they were."""
        with self.lock:
            held, self.held = self.held, []
        for record in held:
            logging.getLogger(record.name).handle(record)
