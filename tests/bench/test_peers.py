"""The benchmark's peers: each runner, in its own process on real PostgreSQL, has a rate only when its
exactly-once check held, and a run that breaks the check has a note instead; the command line refuses bad
arguments; the bench's baselines have a row per peer point, or a note for a peer that is not installed.
Rates are never asserted beyond being positive (what the report sets beside what: test_report.py)."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys

import pytest

from reliableq import scratch
from reliableq.bench import baselines, peer_runners, peers
from reliableq.bench.profiles import PROFILES, batch_point_jobs


def _needs(peer: str) -> None:
    if not peers.installed(peer):
        pytest.skip(f"{peer} is not installed (pip install -e '.[peers]')")


@pytest.fixture
def empty_database():
    """A fresh, empty database on the test server, dropped afterwards."""
    with scratch.empty_database("rq_peertest") as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("mode", peers.MODES)
@pytest.mark.parametrize("peer", peers.PEERS)
async def test_a_peer_run_in_its_own_process_has_a_rate_and_its_check_held(peer, mode):
    """Through the same path the bench takes: a fresh database, a process, one JSON line back."""
    _needs(peer)
    run = await peers.measure(peer, mode, jobs=20, concurrency=2, timeout=60)
    assert (run.exactly_once, run.note) == (True, "")
    assert run.per_second > 0
    assert run.tool == f"{peer}-{ {'ingest': 'enqueue', 'ingest-batch': 'enqueue-batch'}.get(mode, mode)}"


@pytest.mark.parametrize("peer", peers.PEERS)
async def test_a_worker_that_runs_nothing_breaks_the_check_and_gets_a_note_not_a_rate(peer, empty_database,
                                                                                     monkeypatch):
    """The checker failing: jobs preloaded, a worker that never runs them; the peer's own tables say so."""
    _needs(peer)

    async def run_nothing(self, concurrency: int) -> None:
        return None
    monkeypatch.setattr(peer_runners.RUNNERS[peer], "execute", run_nothing)
    run = await peers.run(peer, "execute", 5, 2, empty_database)
    assert not run.exactly_once and run.per_second is None
    assert run.note == "check failed: of 5 jobs 0 ran exactly once (0 runs), 0 completed exactly once, 5 still waiting"


async def test_clients_share_the_jobs_in_batches_of_the_given_size():
    """Batches come from one shared sequence: every job once, full batches, the last call the rest."""
    calls: list[int] = []
    numbers = itertools.count()

    async def enqueue(n: int) -> list[int]:
        calls.append(n)
        await asyncio.sleep(0)  # let the other client take a batch meanwhile
        return [next(numbers) for _ in range(n)]
    ids, _ = await peer_runners._from_clients([enqueue, enqueue], 250, 100)
    assert sorted(calls) == [50, 100, 100] and sorted(ids) == list(range(250))


@pytest.mark.parametrize("peer", peers.PEERS)
async def test_a_batch_enqueue_that_loses_a_job_breaks_the_check(peer, empty_database, monkeypatch):
    """The checker failing for batches as for one job per call: an id acknowledged but not stored."""
    _needs(peer)
    ingest = peer_runners.RUNNERS[peer].ingest

    async def lossy(self, jobs: int, clients: int, batch: int):
        ids, seconds = await ingest(self, jobs - 1, clients, batch)
        return [*ids, 0], seconds  # no peer gives a job id 0
    monkeypatch.setattr(peer_runners.RUNNERS[peer], "ingest", lossy)
    run = await peers.run(peer, "ingest-batch", 5, 2, empty_database)
    assert not run.exactly_once and run.per_second is None
    assert run.note == "check failed: 5 distinct ids for 5 jobs, 4 stored and waiting"


@pytest.mark.parametrize("queue", peers.PICKUP_QUEUES)
async def test_pickup_times_each_job_from_enqueue_to_handler_start(queue):
    """Ours and each peer, the way the bench's pickup scenario runs them: figures only when each job's
    handler ran once. (How fast is the benchmark's to say, not a test's.)"""
    _needs(queue)
    run = await peers.measure(queue, peer_runners.PICKUP, jobs=3, concurrency=1, timeout=60, seed=2)
    assert (run.exactly_once, run.note) == (True, "")
    assert 0 < run.pickup_p50_ms <= run.pickup_p99_ms


async def test_pickup_with_a_handler_run_twice_breaks_the_check(empty_database, monkeypatch):
    """The checker failing: every job's handler is counted as run twice; the run has a note, no figures."""
    ran = peer_runners.ReliableqRunner.ran

    def twice(self, job_id) -> None:
        ran(self, job_id)
        self.handled[job_id] += 1
    monkeypatch.setattr(peer_runners.ReliableqRunner, "ran", twice)
    run = await peers.run("reliableq", peer_runners.PICKUP, 2, 1, empty_database)
    assert not run.exactly_once and run.pickup_p50_ms is None
    assert run.note == "check failed: 6 handler runs for 3 jobs"


@pytest.mark.parametrize(("args", "says"), [
    (["nope", "ingest"], "invalid choice: 'nope'"),
    (["pgqueuer", "run"], "invalid choice: 'run'"),
    (["pgqueuer", "ingest", "--jobs", "0"], "--jobs: must be at least 1"),
    (["pgqueuer", "ingest", "--concurrency", "two"], "--concurrency: not a whole number"),
    (["pgqueuer", "ingest", "--dsn", "not a dsn"], "--dsn: not a PostgreSQL URL"),
    (["pgqueuer", "ingest", "--dsn", "postgresql://localhost"], "--dsn: name the database"),
])
def test_the_command_line_refuses_bad_arguments(args, says):
    given = {"--jobs": "5", "--concurrency": "2", "--dsn": "dbname=rq_peers_never_used"}
    for flag in given:
        if flag not in args:
            args = [*args, flag, given[flag]]
    done = subprocess.run([sys.executable, "-m", "reliableq.bench.peers", *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert says in done.stderr
    assert done.stdout == ""


def test_the_command_line_refuses_a_pgqueuer_worker_of_one():
    """pgqueuer caps a worker at max_concurrent_tasks >= 2 x batch_size: one job at a time is refused."""
    _needs("pgqueuer")
    done = subprocess.run([sys.executable, "-m", "reliableq.bench.peers", "pgqueuer", "execute", "--jobs", "5",
                           "--concurrency", "1", "--dsn", "dbname=rq_peers_never_used"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "cannot cap a worker at one job" in done.stderr


async def test_baselines_have_a_row_per_peer_point_and_a_note_for_a_failed_run(monkeypatch):
    """Each installed peer runs at our ingest client counts and our one-process concurrencies; a run
    without a rate keeps its note."""
    monkeypatch.setattr(baselines, "pgbench_binary", lambda: None)
    monkeypatch.setattr(peers, "installed", lambda peer: True)
    asked = []

    async def fake_measure(peer, mode, jobs, concurrency, timeout):
        asked.append((peer, mode, jobs, concurrency))
        if peer == "pgqueuer" and mode == "execute":
            return peers.PeerRun(peer, mode, jobs, concurrency, note="check failed: ...")
        return peers.PeerRun(peer, mode, jobs, concurrency, exactly_once=True, per_second=100.0, version="9")
    monkeypatch.setattr(peers, "measure", fake_measure)
    profile = PROFILES["quick"]
    found = await baselines.measure_baselines(profile, ["ingest", "execute"])
    points = ([("ingest", c, profile.ingest_jobs) for c in profile.ingest_clients]
              + [("ingest-batch", c, batch_point_jobs(profile, c)) for c in profile.ingest_clients]
              + [("execute", c, profile.execute_jobs) for c in profile.execute_concurrency])
    assert asked == [(peer, mode, jobs, c) for peer in peers.PEERS for mode, c, jobs in points]
    rows = {(b.tool, b.clients): b for b in found}
    assert rows[("procrastinate-enqueue", 4)].per_second == 100.0
    assert rows[("procrastinate-execute", 16)].note.startswith("procrastinate 9 over psycopg 3")
    assert (rows[("pgqueuer-execute", 4)].per_second, rows[("pgqueuer-execute", 4)].note) == (None, "check failed: ...")


async def test_baselines_note_a_peer_that_is_not_installed(monkeypatch):
    monkeypatch.setattr(baselines, "pgbench_binary", lambda: None)
    monkeypatch.setattr(peers, "installed", lambda peer: False)
    found = await baselines.measure_baselines(PROFILES["tiny"], ["ingest", "execute"])
    notes = {b.tool: b.note for b in found if not b.tool.startswith("pgbench")}
    assert notes == {peer: "not installed (pip install 'reliableq[peers]')" for peer in peers.PEERS}
