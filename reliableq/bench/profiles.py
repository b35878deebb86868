"""The benchmark's profiles: how big each scenario is (tiny, quick, full), and the job every run submits.

Counts are jobs or requests per run; times are seconds. A profile only sizes runs; it starts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

PAYLOAD = {"amount_cents": 1250, "currency": "USD"}  # the charge every benchmark job carries
BATCH_JOBS = 100  # jobs per call at every batch point: ours (per request or per insert) and the peers'
BATCHES_PER_CLIENT = 4  # at least this many batches per client at a batch point


@dataclass(frozen=True)
class Profile:
    """How big each scenario is. Counts are jobs or requests per run; times are seconds."""

    name: str
    ingest_jobs: int
    ingest_clients: tuple[int, ...]
    execute_jobs: int
    execute_concurrency: tuple[int, ...]  # one worker process with this many permits
    execute_processes: tuple[tuple[int, int], ...]  # (worker processes, permits each)
    latency_jobs: int
    latency_concurrency: tuple[int, ...]
    charge_latency_seconds: float
    kill9_leases: tuple[float, ...]
    retry_jobs: int
    retry_rates: tuple[float, ...]
    idempotency_requests: int
    idempotency_clients: int
    dead_jobs: int
    semaphore_jobs: int
    semaphore_permits: int
    semaphore_latency_seconds: float
    pgbench_seconds: float
    mechanism_jobs: int  # charged jobs per run of the mechanisms scenario, the same for every switch
    mechanism_processes: tuple[int, int]  # its (worker processes, permits each): two, so claims race
    pickup_jobs: int = 10  # jobs timed one at a time from enqueue to handler start, per queue
    repeats: int = 1  # runs per point; the summary averages the passing ones
    settle_seconds: float = 120.0  # a run that has not settled by then fails
    retention_history: int = 200_000  # finished jobs the retention scenario starts with (then drains execute_jobs)
    standby_jobs: int = 400  # jobs submitted and run at each replication point of the standby scenario
    fairness_pending: int = 100_000  # due jobs behind each claim the fairness scenario times
    fairness_claims: int = 40  # claims timed per claim and point
    # The quiet-tenant scenario: one tenant's backlog of flood_jobs due at once, drained while another
    # tenant submits quiet_jobs one by one; the schedule must end well before the drain does.
    flood_jobs: int = 20_000
    quiet_jobs: int = 100
    # Scenarios this profile runs only when named (--scenarios): at its sizes they would show nothing.
    left_to_full: tuple[str, ...] = ()


PROFILES = {
    # For the harness's own tests: seconds, not minutes; figures meaningless.
    "tiny": Profile("tiny", ingest_jobs=20, ingest_clients=(2,), execute_jobs=20, execute_concurrency=(2,),
                    retention_history=2_000,
                    execute_processes=((2, 1),), latency_jobs=10, latency_concurrency=(2,),
                    charge_latency_seconds=0.01, kill9_leases=(1.0,), retry_jobs=10, retry_rates=(0.25,),
                    idempotency_requests=20, idempotency_clients=5, dead_jobs=5, semaphore_jobs=6,
                    semaphore_permits=2, semaphore_latency_seconds=0.05, pgbench_seconds=0.5, mechanism_jobs=20,
                    mechanism_processes=(2, 2), pickup_jobs=3, standby_jobs=20, fairness_pending=2_000,
                    fairness_claims=3, flood_jobs=1_000, quiet_jobs=5,
                    settle_seconds=60),
    # 5-6 minutes on this project's two cores (5 min 16 s for the reference notebook 13
    # ships; 11 min 11 s before these sizes, 209 s of it pgqueuer's 1 s pickup times 200 jobs and 90 s
    # retention). Fewer points than full, each of them one of full's; retention is left to full, whose
    # million-job history is what makes its point. Ingest points hold full's 4,000 jobs: 800 were windows
    # of 0.2-0.9 s beside pgbench's 2 s, and 4 clients over HTTP read 1,755 and 2,499 a second in two runs
    # minutes apart.
    "quick": Profile("quick", ingest_jobs=4_000, ingest_clients=(1, 4, 16), execute_jobs=800,
                     execute_concurrency=(1, 4, 16), execute_processes=((2, 8),),
                     latency_jobs=400, latency_concurrency=(16,), charge_latency_seconds=0.01,
                     kill9_leases=(1.0, 3.0), retry_jobs=100, retry_rates=(0.0, 0.25, 0.5),
                     idempotency_requests=300, idempotency_clients=50, dead_jobs=200, semaphore_jobs=40,
                     semaphore_permits=4, semaphore_latency_seconds=0.1, pgbench_seconds=2.0,
                     mechanism_jobs=1000, mechanism_processes=(2, 4), pickup_jobs=20, flood_jobs=5_000,
                     quiet_jobs=20, left_to_full=("retention",)),
    "full": Profile("full", ingest_jobs=4000, ingest_clients=(1, 4, 8, 16, 32), execute_jobs=6000,
                    retention_history=1_000_000,
                    execute_concurrency=(1, 2, 4, 8, 16), execute_processes=((2, 8), (4, 4), (4, 8)),
                    latency_jobs=2000, latency_concurrency=(8, 16, 32), charge_latency_seconds=0.01,
                    kill9_leases=(1.0, 2.0, 5.0), retry_jobs=600, retry_rates=(0.0, 0.1, 0.25, 0.5),
                    idempotency_requests=2000, idempotency_clients=100, dead_jobs=1000, semaphore_jobs=100,
                    semaphore_permits=8, semaphore_latency_seconds=0.1, pgbench_seconds=10.0, mechanism_jobs=4000,
                    mechanism_processes=(2, 8), pickup_jobs=300, standby_jobs=2000, fairness_pending=1_000_000,
                    repeats=3, settle_seconds=300),
}


def batch_point_jobs(profile: Profile, clients: int) -> int:
    """Jobs at a batch point of `clients` clients, ours and the peers' alike: the profile's, and at least
    BATCHES_PER_CLIENT batches a client (a handful of calls measures start-up, not a steady rate)."""
    return max(profile.ingest_jobs, BATCHES_PER_CLIENT * clients * BATCH_JOBS)
