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
times the worker time); a fleet limit and retries are shared out the same way, per claim.
"""

from __future__ import annotations

from dataclasses import replace

from reliableq.config import Mechanisms
from reliableq.lab.experiment import Prediction, experiment, stage_mechanisms
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
        return await run.result(measured)


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
