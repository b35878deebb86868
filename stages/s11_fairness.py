"""Stage 11, fairness: one tenant's backlog must not starve another tenant's job.

Failure: tenant A has a backlog of jobs waiting; tenant B submits one job a moment later. The claim takes
the oldest due jobs first (first in, first out), so B's job waits until every one of A's has been
claimed: its wait is A's backlog, and grows with it.
Invariant: a due job waits for at most one round of the tenants with due work: no more than K × L jobs
of other tenants are claimed ahead of it (K tenants with due work, L jobs per claim), however long
anyone's backlog (jobs_ahead_of_b <= fair_bound).
Mechanism: the fair claim (sql/queue.sql job_claim_due_fair), still one statement with SKIP LOCKED, leased
and fenced: each tenant with due work is offered its oldest due job before any is offered a second, and
each claim starts its round one tenant further on. Work-conserving: a lone tenant gets every slot.
Boundary: fair by count of jobs, not by their cost (a tenant whose jobs take ten times as long gets ten
times the worker time); a fleet limit and retries are shared out the same way, per claim (a retry takes
one of its own tenant's turns). shares_by_cost measures it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from reliableq.charge.service import ChargeFaults
from reliableq.config import DEFAULT_MAX_ATTEMPTS, Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
from reliableq.lab.invariants import Check
from reliableq.lab.ledger import read_rows
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

NAME = "fairness"
MECHANISM = "fairness"
FAILURE = ("one tenant's backlog holds back another tenant's job: claimed first in, first out, tenant B's one "
           "job waits until every earlier job of tenant A has been claimed")
INVARIANT = ("a due job waits for at most one round of the tenants with due work, however long anyone's backlog "
             "(jobs_ahead_of_b <= fair_bound)")
OWN_KNOBS = ()
BACKLOG_PER_JOB = 5  # tenant A's backlog is this many jobs for each of the `jobs` knob's
TENANTS = ("tenant-a", "tenant-b")
PREDICTION = Prediction(
    question=(
        "Tenant A has 20 jobs waiting; tenant B submits one job just after. One worker takes two jobs per claim. "
        "First in, first out, B's job waits behind all 20. With the fair claim, how many of A's jobs are "
        "claimed no later than B's?"
    ),
    options=[
        "None or one: B's job is in the first claim",
        "About ten: B's job waits for every other turn",
        "All 20 still: B's job is the newest",
    ],
    answer="None or one: B's job is in the first claim",
    why=(
        "The fair claim offers every tenant with due work its oldest job before anyone's second, so a claim of "
        "two takes one of A's and B's: at most one of A's comes no later than B's, and that holds whether A has "
        "20 jobs waiting or 10,000."
    ),
)


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """Tenant A's backlog (`params.jobs` × BACKLOG_PER_JOB jobs), then tenant B's one job; then one worker
    of `params.concurrency` permits runs them all. Measured: how many of A's jobs were claimed no later than
    B's, and how long B's job waited."""
    async with experiment(NAME, MECHANISM, on, params) as run:
        backlog = await run.submit(jobs=params.jobs * BACKLOG_PER_JOB, tenant=TENANTS[0])
        (b_job,) = await run.submit(jobs=1, tenant=TENANTS[1])
        run.note(TENANTS[1], "submitted", f"{TENANTS[1]}'s one job", b_job)
        run.system.start_worker(run.worker("worker-1"))
        await run.wait_settled([*backlog, b_job], timeout=60.0)
        claims = await read_rows(run.system.databases.queue_url, "lab_queue", "job_first_claims")
        b_claim = next(row for row in claims if row["job_id"] == b_job)
        measured = {
            "backlog_of_a": len(backlog),
            # Claimed no later than B's: a claim that takes some of A's with B's does not count as B's alone
            # (whether one claim or two take the last of A's and B's is the worker's timing).
            "jobs_ahead_of_b": sum(row["tenant"] != TENANTS[1] and row["claimed_at"] <= b_claim["claimed_at"]
                                   for row in claims),
            # K tenants with due work, L jobs per claim: one round.
            "fair_bound": len(TENANTS) * params.concurrency,
            "b_waited_seconds": round((b_claim["claimed_at"] - b_claim["created_at"]).total_seconds(), 3),
        }
        run.note(TENANTS[1], "claimed", f"claimed after {measured['jobs_ahead_of_b']} of {TENANTS[0]}'s", b_job,
                 at=b_claim["claimed_at"])
        within = measured["jobs_ahead_of_b"] <= measured["fair_bound"]
        waited = Check(INVARIANT, [] if within else [{"jobs_ahead_of_b": measured["jobs_ahead_of_b"],
                                                      "fair_bound": measured["fair_bound"]}])
        return await run.result(measured, [waited])


GROWTH_JOBS = (4, 20, 80)  # the `jobs` knob for waits_by_backlog: backlogs of 20, 100 and 400


async def waits_by_backlog(params: ScenarioParams = ScenarioParams(), jobs: tuple[int, ...] = GROWTH_JOBS
                           ) -> list[dict[str, float | int]]:
    """The scenario off and on at each backlog size (`jobs` × BACKLOG_PER_JOB): how many of A's jobs were
    claimed ahead of B's, and how long B's waited, first in first out and fair."""
    rows = []
    for size in jobs:
        sized = replace(params, jobs=size)
        fifo, fair = await scenario(False, sized), await scenario(True, sized)
        rows.append({"backlog_of_a": fifo.measurements["backlog_of_a"],
                     "ahead_of_b_fifo": fifo.measurements["jobs_ahead_of_b"],
                     "ahead_of_b_fair": fair.measurements["jobs_ahead_of_b"],
                     "b_waited_seconds_fifo": fifo.measurements["b_waited_seconds"],
                     "b_waited_seconds_fair": fair.measurements["b_waited_seconds"]})
    return rows


# shares_by_cost: the boundary shown. Each tenant's jobs take this long inside their effect (a pause there
# stands for slow work by a live worker, which keeps renewing its lease): A's ten times B's.
EFFECT_SECONDS = {TENANTS[0]: 0.5, TENANTS[1]: 0.05}
COST_BACKLOG_PER_JOB = {TENANTS[0]: 3, TENANTS[1]: 12}  # × the `jobs` knob: B's outlasts A's claims, retries included
FLEET_LIMIT = 2  # jobs in flight across both workers (each of `concurrency` permits): the slots to share


@dataclass
class FirstChargeRefused(ChargeFaults):
    """The charge service's faults, and a transient failure (503) of the first request of each job in
    `jobs` (ids as text): those jobs are retried once, whatever the seed."""

    jobs: tuple[str, ...] = ()

    def draw(self, job_id: str, nth_request: int) -> str | None:
        if nth_request == 0 and str(job_id) in self.jobs:
            return "transient"
        return super().draw(job_id, nth_request)


async def shares_by_cost(params: ScenarioParams = ScenarioParams()) -> list[dict[str, float | int | str]]:
    """The boundary, measured: both tenants with a backlog, the fair claim on, two workers sharing a fleet
    limit of FLEET_LIMIT jobs in flight; A's effect takes ten times as long as B's (EFFECT_SECONDS; each
    claim adds the queue's own few milliseconds), and each of A's jobs fails transiently once (a 503 from
    the charge service), so it is retried. Per tenant, from what PostgreSQL recorded: its claims while both
    had a due job waiting (the fair claim shares these by count; a retry is one of its own tenant's), and
    its worker-seconds, their share and its jobs in flight on average over that stretch; over the whole
    run its jobs, claims, retries and seconds per claim."""
    charge_faults = FirstChargeRefused(seed=params.seed)
    async with experiment(NAME, MECHANISM, True, params, charge_faults) as run:
        faults = run.faults()
        for tenant, seconds in EFFECT_SECONDS.items():
            # Every attempt of the tenant's jobs: none is claimed more often than its attempt budget.
            faults.arm_pause("during_effect", seconds=seconds,
                             times=DEFAULT_MAX_ATTEMPTS * params.jobs * COST_BACKLOG_PER_JOB[tenant],
                             job_filter=lambda job, tenant=tenant: job.tenant == tenant)
        backlogs = {tenant: await run.submit(jobs=params.jobs * per_job, tenant=tenant)
                    for tenant, per_job in COST_BACKLOG_PER_JOB.items()}
        charge_faults.jobs = tuple(str(job_id) for job_id in backlogs[TENANTS[0]])  # the service reads it live
        for worker_id in ("worker-1", "worker-2"):
            run.system.start_worker(run.worker(worker_id, faults, fleet_limit=FLEET_LIMIT))
        await run.wait_settled([job_id for ids in backlogs.values() for job_id in ids], timeout=60.0)
        await run.system.stop_workers()
        rows = await read_rows(run.system.databases.queue_url, "lab_queue", "job_attempt_shares_by_tenant")
    return [{"tenant": row["tenant"], "jobs": row["jobs"], "claims": row["claims"], "retries": row["retries"],
             "seconds_per_claim": round(row["seconds_per_claim"], 3),
             "claims_while_both_waited": row["claims_contested"],
             "retries_while_both_waited": row["retries_contested"],
             "worker_seconds": round(row["worker_seconds_contested"], 2),
             "worker_share": round(row["worker_share_contested"], 3),
             "avg_in_flight": round(row["in_flight_contested"], 2),
             "both_waited_seconds": round(row["contested_seconds"], 2)} for row in rows]
