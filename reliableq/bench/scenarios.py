"""The benchmark's scenarios, by name: what each measures and how, against real processes.

Each scenario runs its points through `Bench.measure`, which times them, gates them and keeps failed
runs apart. Ingestion is `reliableq.bench.ingest`, retention `reliableq.bench.retention`, the standby's
cost and a failover's gap `reliableq.bench.standby`, the fair claim's cost and a quiet tenant beside a
flood `reliableq.bench.fairness`; execution (no-op jobs fair and first in first out), latency, kill -9
recovery, retry amplification, idempotency, DEAD and the semaphore are here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

import httpx

from reliableq.bench import peers
from reliableq.bench.client_cost import client_cost
from reliableq.bench.fairness import CLAIM_SIZE as FAIR_CLAIM_SIZE
from reliableq.bench.fairness import FLOOD_PERMITS, FLOOD_WORKERS, QUIET_TENANT, fairness, quiet_tenant
from reliableq.bench.fairness import TENANTS as FAIR_TENANTS
from reliableq.bench.gate import UNCHARGED_CHECK, WAIVED_WHEN_OFF, gate
from reliableq.bench.ingest import INGEST_VIAS, ingest
from reliableq.bench.peer_runners import PICKUP
from reliableq.bench.profiles import BATCH_JOBS, PAYLOAD
from reliableq.bench.results import Measured, Sample, Window, worker_time_metrics
from reliableq.bench.retention import retention
from reliableq.bench.runner import Bench, Scenario
from reliableq.bench.stack import drain, preload, reclaim_lags, run_span, run_system, server_cpu_seconds
from reliableq.bench.standby import POINTS as STANDBY_POINTS
from reliableq.bench.standby import standby
from reliableq.config import Mechanisms
from reliableq.lab import invariants
from reliableq.lab.demo import kill_after_charge
from reliableq.lab.invariants import Check
from reliableq.lab.ledger import job_counts
from reliableq.queue import idempotency_key


async def _drained(bench: Bench, label: str, jobs: int, workers: int, permits: int, kind: str = "charge",
                   charge_args: Sequence[str] = (), mechanisms: Mechanisms | None = None,
                   waive: dict[str, str] | None = None) -> Measured:
    """`jobs` preloaded and drained by `workers` processes of `permits` each, on a system of its own with
    `mechanisms` (default: the bench's); its rate, where the time went, and its gate (`waive`: as gate's)."""
    async with run_system(bench, label, charge_args, mechanisms=mechanisms) as system:
        charge_cpu_before, server_cpu_before = (await system.charge_stats())["cpu_seconds"], server_cpu_seconds()
        window = await drain(bench, system, jobs, workers, permits, kind)
        charge_cpu = (await system.charge_stats())["cpu_seconds"] - charge_cpu_before
        server_cpu = server_cpu_seconds()
        stats = await system.stop_worker_processes()
        span = await run_span(system)
        passed, checks = await gate(system.databases, waive=waive)
    seconds = span["seconds"] or window.seconds
    metrics = {"jobs": span["jobs"], "succeeded": span["succeeded"], "seconds": seconds,
               "jobs_per_second": span["jobs"] / seconds if seconds else None,
               "clients": workers * permits,
               "charge_cpu_ms_per_job": 1000 * charge_cpu / span["jobs"] if span["jobs"] else None,
               "server_cpu_ms_per_job": (1000 * (server_cpu - server_cpu_before) / span["jobs"]
                                         if span["jobs"] and server_cpu is not None and server_cpu_before is not None
                                         else None),
               } | worker_time_metrics(stats, span["jobs"])
    return Measured(metrics, passed, checks, [], window)


async def _execute_points(bench: Bench, repeat: int, scenario: str, jobs: int,
                          points: Sequence[tuple[int, int]], charge_args: Sequence[str] = (),
                          kind: str = "charge", fairness_twins: bool = False) -> None:
    """Each point drained with the bench's mechanisms; with `fairness_twins`, each again just after with the
    fairness mechanism the other way (its twin, `1x4 FIFO` or `1x4 fair`), so the two claims meet the same
    jobs on the same machine minutes apart at most. The twin runs second: a bench's first runs are its
    coldest, so any warm-up is charged to the bench's own claim (fair, by default)."""
    waive = {UNCHARGED_CHECK: "no-op jobs have no effect"} if kind == "noop" else None
    fair = bench.mechanisms.fairness
    for workers, permits in points:
        point = f"{workers}x{permits}"
        params = {"workers": workers, "permits": permits, "jobs": jobs, "kind": kind,
                  "charge_args": list(charge_args), "fairness": fair}
        runs = [(point, bench.mechanisms, params)]
        if fairness_twins:
            twin = f"{point} {'FIFO' if fair else 'fair'}"
            runs.append((twin, bench.mechanisms.with_flags(fairness=not fair),
                         params | {"fairness": not fair, "fairness_twin_of": point}))
        for name, mechanisms, run_params in runs:
            async def body(workers=workers, permits=permits, name=name, mechanisms=mechanisms) -> Measured:
                return await _drained(bench, f"{scenario}-{name}-{repeat}", jobs, workers, permits, kind, charge_args,
                                      mechanisms=mechanisms, waive=waive)
            await bench.measure(scenario, name, run_params, "jobs_per_second", repeat, body)


async def _execute(bench: Bench, repeat: int) -> None:
    p = bench.profile
    points = [(1, c) for c in p.execute_concurrency] + list(p.execute_processes)
    await _execute_points(bench, repeat, "execute", p.execute_jobs, points)


async def _noop(bench: Bench, repeat: int) -> None:
    """No-op jobs of one tenant, claimed fair and first in first out at each point: what the fair claim
    costs where it has no one to be fair between (the report's fair / FIFO)."""
    p = bench.profile
    await _execute_points(bench, repeat, "noop", p.execute_jobs, [(1, c) for c in p.execute_concurrency],
                          kind="noop", fairness_twins=True)


async def _latency(bench: Bench, repeat: int) -> None:
    p = bench.profile
    await _execute_points(bench, repeat, "latency", p.latency_jobs, [(1, c) for c in p.latency_concurrency],
                          ["--latency", str(p.charge_latency_seconds)])


async def _kill9(bench: Bench, repeat: int) -> None:
    for lease in bench.profile.kill9_leases:
        point = f"lease={lease:g}s"

        async def body(lease=lease, point=point) -> Measured:
            async with run_system(bench, f"kill9-{point}-{repeat}") as system:
                await preload(system, 1)
                (job,) = await system.queue.list()
                run = await kill_after_charge(system, job.id, lease, "--concurrency", "1", "--seed", str(bench.seed))
                await system.stop_worker_processes()
                lags = await reclaim_lags(system)
                (counts,) = await job_counts(system.databases)
                passed, checks = await gate(system.databases)
            metrics = {"recovery_seconds": run.recovery_seconds, "reclaim_lag_seconds": lags[0] if lags else None,
                       "lease_seconds": lease, "attempts": counts.attempts, "handler_runs": counts.handler_runs,
                       "charges": counts.charges, "finalizations": counts.finalizations}
            return Measured(metrics, passed, checks, [Sample(run.killed, run.recovered)],
                            Window(run.killed, run.recovered))
        await bench.measure("kill9", point, {"lease_seconds": lease}, "recovery_seconds", repeat, body)


async def _retry(bench: Bench, repeat: int) -> None:
    p = bench.profile
    for rate in p.retry_rates:
        point = f"transient={rate:.0%}"

        async def body(rate=rate, point=point) -> Measured:
            charge_args = ["--transient-rate", str(rate), "--seed", str(bench.seed)]
            async with run_system(bench, f"retry-{point}-{repeat}", charge_args) as system:
                window = await drain(bench, system, p.retry_jobs, 1, 8)
                stats = await system.stop_worker_processes()
                counts = await job_counts(system.databases)
                passed, checks = await gate(system.databases)
            jobs = len(counts)
            metrics = {"jobs": jobs, "transient_rate": rate,
                       "attempts_per_job": sum(c.attempts for c in counts) / jobs,
                       "requests_per_job": sum(c.handler_runs for c in counts) / jobs,
                       "charges_per_succeeded_job": (sum(c.charges for c in counts if c.status == "SUCCEEDED")
                                                     / max(1, sum(c.status == "SUCCEEDED" for c in counts))),
                       "dead": sum(c.status == "DEAD" for c in counts), "seconds": window.seconds,
                       } | worker_time_metrics(stats)
            return Measured(metrics, passed, checks, [], window)
        await bench.measure("retry", point, {"transient_rate": rate, "jobs": p.retry_jobs, "seed": bench.seed},
                            "requests_per_job", repeat, body)


async def _idempotency(bench: Bench, repeat: int) -> None:
    p = bench.profile
    point = f"{p.idempotency_requests} requests, 1 key"

    async def body() -> Measured:
        async with run_system(bench, f"idempotency-{repeat}") as system:
            job_id = uuid.UUID(int=bench.seed + 1)  # one job, one key, whatever the run
            headers = {"Idempotency-Key": idempotency_key("charge", job_id)}
            statuses: list[int] = []
            samples: list[Sample] = []
            remaining = iter(range(p.idempotency_requests))
            async with httpx.AsyncClient(base_url=system.charge_url, timeout=30) as http:
                async def client() -> None:
                    for _ in remaining:
                        begun = time.monotonic()
                        response = await http.post("/v1/charges", json={"job_id": str(job_id), **PAYLOAD},
                                                   headers=headers)
                        samples.append(Sample(begun, time.monotonic()))
                        statuses.append(response.status_code)
                start = time.monotonic()
                await asyncio.gather(*(client() for _ in range(p.idempotency_clients)))
                window = Window(start, time.monotonic())
            created = statuses.count(201)
            one_created = Check("exactly one of the concurrent requests created the charge",
                                [] if created == 1 else [{"created": created}], note=f"{created} created")
            passed, checks = await gate(system.databases, extra=[one_created])
        metrics = {"requests": len(statuses), "created": created, "replayed": statuses.count(200),
                   "other": len(statuses) - created - statuses.count(200),
                   "requests_per_second": len(statuses) / window.seconds}
        return Measured(metrics, passed, checks, samples, window)
    await bench.measure("idempotency", point, {"requests": p.idempotency_requests,
                                               "clients": p.idempotency_clients}, "requests_per_second", repeat, body)


async def _dead(bench: Bench, repeat: int) -> None:
    p = bench.profile

    async def body() -> Measured:
        async with run_system(bench, f"dead-{repeat}", ["--permanent-rate", "1", "--seed", str(bench.seed)]) as system:
            window = await drain(bench, system, p.dead_jobs, 1, 8)
            stats = await system.stop_worker_processes()
            counts = await job_counts(system.databases)
            span = await run_span(system)
            wrong = [{"job_id": c.job_id, "status": c.status, "attempts": c.attempts}
                     for c in counts if c.status != "DEAD" or c.attempts != 1]
            dead_once = Check("a permanent failure goes DEAD after one attempt, never retried", wrong)
            passed, checks = await gate(system.databases, extra=[dead_once])
        seconds = span["seconds"] or window.seconds
        metrics = {"jobs": len(counts), "dead": span["dead"], "seconds": seconds,
                   "jobs_per_second": len(counts) / seconds} | worker_time_metrics(stats)
        return Measured(metrics, passed, checks, [], window)
    await bench.measure("dead", "permanent=100%", {"jobs": p.dead_jobs}, "jobs_per_second", repeat, body)


async def _semaphore(bench: Bench, repeat: int) -> None:
    p = bench.profile
    permits, latency = p.semaphore_permits, p.semaphore_latency_seconds

    async def body() -> Measured:
        async with run_system(bench, f"semaphore-{repeat}", ["--latency", str(latency)]) as system:
            window = await drain(bench, system, p.semaphore_jobs, 1, permits)
            service = await system.charge_stats()
            stats = await system.stop_worker_processes()
            span = await run_span(system)
            bounded = [invariants.capacity_check([s.get("in_flight_peak", 0) for s in stats], permits),
                       Check(f"the slow dependency never saw more than {permits} requests at once",
                             [] if service["in_flight_peak"] <= permits else [service],
                             note=f"peak {service['in_flight_peak']}")]
            passed, checks = await gate(system.databases, extra=bounded)
        seconds = span["seconds"] or window.seconds
        metrics = {"jobs": span["jobs"], "seconds": seconds, "jobs_per_second": span["jobs"] / seconds,
                   "bound_jobs_per_second": permits / latency, "service_in_flight_peak": service["in_flight_peak"],
                   } | worker_time_metrics(stats)
        return Measured(metrics, passed, checks, [], window)
    await bench.measure("semaphore", f"{permits} permits, {latency * 1000:g} ms dependency",
                        {"permits": permits, "latency_seconds": latency, "jobs": p.semaphore_jobs},
                        "jobs_per_second", repeat, body)


# The mechanisms whose work lies on the path of jobs that succeed: each is switched off in turn on the same
# workload. The rest do nothing in such a run, so switching them off would measure noise; their price is
# in the scenarios named here.
COSTED_MECHANISMS = ("skip_locked", "leases", "fencing", "idempotency", "semaphore")
UNCOSTED_MECHANISMS = {
    "commit_before_ack": "acts on the API's submissions, and this workload's jobs are preloaded; it moves the "
                         "202, not the work (ingest over HTTP pays it)",
    "backoff": "acts only when a charge fails, and none fails here (the retry scenario prices it)",
    "dead": "acts only when a charge fails, and none fails here (the dead scenario prices it)",
}
ALL_ON = "all on"


async def _mechanisms(bench: Bench, repeat: int) -> None:
    """The same charged jobs with every mechanism on, and with each costed one off in turn. All on runs
    before each of them and once more at the end: a machine shared with other work drifts and stalls, and
    the spread of the all-on runs shows how much, so a ratio within it is not read as a cost."""
    p = bench.profile
    workers, permits = p.mechanism_processes
    costed = [name for name in COSTED_MECHANISMS if getattr(bench.mechanisms, name)]
    for off in [*(step for name in costed for step in (None, name)), None]:
        point = ALL_ON if off is None else f"{off} off"
        mechanisms = bench.mechanisms if off is None else bench.mechanisms.without(off)
        waive = WAIVED_WHEN_OFF.get(off, {})

        async def body(point=point, mechanisms=mechanisms, waive=waive) -> Measured:
            return await _drained(bench, f"mechanisms-{point}-{repeat}", p.mechanism_jobs, workers, permits,
                                  mechanisms=mechanisms, waive=waive)
        await bench.measure("mechanisms", point, {"off": off, "jobs": p.mechanism_jobs, "workers": workers,
                                                  "permits": permits, "waived": waive},
                            "jobs_per_second", repeat, body)


async def _pickup(bench: Bench, repeat: int) -> None:
    """Each queue in its own process, as the peers run (reliableq/bench/peers.py); not installed: no run."""
    for queue in peers.PICKUP_QUEUES:
        if not peers.installed(queue):
            continue

        jobs = bench.profile.pickup_jobs
        timeout = bench.profile.settle_seconds + jobs * peers.PICKUP_SECONDS_PER_JOB

        async def body(queue=queue, jobs=jobs, timeout=timeout) -> Measured:
            run = await peers.measure(queue, PICKUP, jobs, 1, timeout, seed=bench.seed + repeat)
            check = {"name": "every job's handler ran once", "held": run.exactly_once,
                     "violations": 0 if run.exactly_once else 1, "note": run.note or f"{queue} {run.version}",
                     "waived": "", "examples": []}
            return Measured({"pickup_p50_ms": run.pickup_p50_ms, "pickup_p99_ms": run.pickup_p99_ms,
                             "jobs": run.jobs}, run.exactly_once, [check])
        await bench.measure("pickup", queue, {"queue": queue, "jobs": jobs}, "pickup_p50_ms", repeat, body,
                            timeout + 60)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("ingest", f"durable submission, one job per call and {BATCH_JOBS} per call: over HTTP to the API "
             "process, and straight into PostgreSQL from the bench's process (direct: beside the peers' enqueue)",
             lambda p: len(INGEST_VIAS) * len(p.ingest_clients), ingest),
    Scenario("execute", "zero-latency charges: one worker process at each concurrency, then several processes",
             lambda p: len(p.execute_concurrency) + len(p.execute_processes), _execute),
    Scenario("noop", "no-op jobs: the queue's own cost (claim, lease, fenced finalize), as pgbench and the peers "
             "measure it; each point again with the fairness mechanism the other way (its twin: `1x4 FIFO`), "
             "set beside it only", lambda p: 2 * len(p.execute_concurrency), _noop),
    Scenario("latency", "execution when every charge takes the profile's charge latency",
             lambda p: len(p.latency_concurrency), _latency),
    Scenario("kill9", "a worker SIGKILLed after its charge committed; time until another finishes the job",
             lambda p: len(p.kill9_leases), _kill9),
    Scenario("retry", "retry amplification: charge requests per job at each transient failure rate",
             lambda p: len(p.retry_rates), _retry),
    Scenario("idempotency", "many concurrent requests with one idempotency key: one charge",
             lambda p: 1, _idempotency),
    Scenario("dead", "every charge permanently refused: each job DEAD after one attempt", lambda p: 1, _dead),
    Scenario("retention", "no-op jobs over a large finished history, kept or pruned first (`reliableq prune`): "
             "the hot path's cost of never deleting, and the pruner's rate", lambda p: 2, retention),
    Scenario("semaphore", "a slow dependency: in-flight work stays within the worker's permits",
             lambda p: 1, _semaphore),
    Scenario("mechanisms", "what each mechanism costs: the same charged jobs with every mechanism on, and with "
             f"each of {', '.join(COSTED_MECHANISMS)} off in turn (all on again before each, and at the end)",
             lambda p: 2 * len(COSTED_MECHANISMS) + 1, _mechanisms),
    Scenario("standby", "a primary whose commits wait for a synchronous standby, one with an asynchronous standby, "
             "and one alone: HTTP submissions and charged jobs on each; then a failover, timed from the primary's "
             "death to the first 202 and the first claim on the promoted server (reliableq/bench/standby.py)",
             lambda p: len(STANDBY_POINTS), standby),
    Scenario("fairness", f"one claim of {FAIR_CLAIM_SIZE} jobs over the profile's backlog shared by 1, 10 and "
             "1,000 tenants: first in first out, and fair (reliableq/bench/fairness.py)",
             lambda p: len(FAIR_TENANTS), fairness),
    Scenario(QUIET_TENANT, f"one tenant's backlog (the profile's flood) drained by {FLOOD_WORKERS} worker processes "
             f"of {FLOOD_PERMITS} permits while a quiet tenant submits one no-op job at a time on a seeded schedule: "
             "milliseconds from each quiet job's insert to its claim (p50, p99), first in first out and fair "
             "(reliableq/bench/fairness.py)", lambda p: 2, quiet_tenant),
    Scenario("client-cost", "where the time goes at one client: a worker process of one permit draining no-op "
             "jobs, and the API taking one job per request, each profiled (cProfile, kept in profiles/) with its "
             "round trips to PostgreSQL counted; per job and per request, round trips, CPU and commits "
             "(reliableq/bench/client_cost.py)", lambda p: 2, client_cost),
    Scenario("pickup", "an idle system: one no-op job at a time, milliseconds from its enqueue call to its "
             "handler's start (p50, p99), ours with and without wake-on-submit beside pgqueuer and procrastinate, "
             "each in-process in its own process (reliableq/bench/peers.py)",
             lambda p: sum(map(peers.installed, peers.PICKUP_QUEUES)), _pickup),
)}
