"""Scratch databases are never left behind: one made by a process that was then SIGKILLed is a leftover, and
the next process to make scratch databases drops it; one whose owner still runs is never touched. And a
command waits for an embedded server that is still starting (pg_ctl's own wait is 10 s) instead of
failing, but not for one that has exited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from reliableq import db, scratch
from reliableq.lab.waiting import wait_until

# A process that makes one scratch database, prints its name, and waits to be killed (or told to go on).
MAKE_ONE = """
from reliableq import db, scratch
admin = db.server_url()
name = scratch.owned_name(admin, "rq_owned")
db.create_database(admin, name)
print(name, flush=True)
input()
"""
# The next process to name a scratch database: naming it hands every leftover to its background droppers,
# which drop them while it lives (however long that takes: each drop waits for a checkpoint, and beside a
# loaded run the server held hundreds of leftovers). It lives until told to go on.
NEXT_OWNER = """
from reliableq import db, scratch
scratch.owned_name(db.server_url(), "rq_next")
print("swept", flush=True)
input()
"""


def _maker() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", MAKE_ONE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    return process, process.stdout.readline().strip()


def _exists(name: str) -> bool:
    with psycopg.connect(db.server_url(), autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


@pytest.mark.timeout(330)  # the next owner's drops may take minutes (NEXT_OWNER)
async def test_a_killed_owners_database_is_dropped_by_the_next_owner_and_a_live_ones_is_kept():
    killed, orphan = _maker()
    alive, kept = _maker()
    processes = [killed, alive]
    try:
        assert _exists(orphan) and _exists(kept)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        await wait_until(lambda: orphan in scratch.leftover_names(db.server_url()), timeout=10,
                         what="the killed process's session to end")
        assert kept not in scratch.leftover_names(db.server_url())
        next_owner = subprocess.Popen([sys.executable, "-c", NEXT_OWNER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        processes.append(next_owner)
        assert next_owner.stdout.readline() == "swept\n"
        await wait_until(lambda: not _exists(orphan), timeout=280, what="the next owner's drop of the leftover",
                         interval=0.25)
        assert _exists(kept)
    finally:
        for process in processes:
            process.kill()
            process.wait()
        db.drop_database(db.server_url(), kept)


# A process with two leftovers to drop whose drops never end (held on an event) and a scratch pair of its
# own: its own pair is dropped by the two droppers left, and the wait at exit ends with it.
OWN_DROPS_FIRST = """
import threading
from reliableq import db, scratch
held = threading.Event()
drop = db.drop_database
db.drop_database = lambda admin, name: held.wait() if name.startswith("rq_left") else drop(admin, name)
admin = db.server_url()
for number in range(2):
    scratch._drop_later(admin, (f"rq_left_{number}",), scratch.LEFTOVER)
with scratch.scratch_databases("rq_own") as own:
    pass
print(scratch.drop_pending(timeout=240), db.database_name(own.queue_url), flush=True)
held.set()
"""


@pytest.mark.timeout(300)  # beside a loaded run, a drop waits for a checkpoint that may take a minute
def test_a_process_waits_for_its_own_drops_not_for_the_leftovers_it_was_handed():
    """Else a command on a server holding hundreds of leftovers waited its DROPS_AT_EXIT_SECONDS each time.
    Held leftovers never finish: a wait that counted them could never say it emptied."""
    result = subprocess.run([sys.executable, "-c", OWN_DROPS_FIRST], capture_output=True, text=True, timeout=270)
    assert result.returncode == 0, result.stderr
    emptied, own_queue_database = result.stdout.split()
    assert emptied == "True"
    assert not _exists(own_queue_database)


@pytest.mark.slow
def test_the_wait_for_a_starting_server_ends_when_it_is_ready_and_at_once_when_it_exited(tmp_path: Path):
    stand_in = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)  # a live pid
    pid_file = tmp_path / "postmaster.pid"

    def write(status: str, pid: int) -> None:
        pid_file.write_text("\n".join([str(pid), str(tmp_path), "0", "5432", str(tmp_path), "", "0 0", status]))

    try:
        write("starting", stand_in.pid)
        ready_later = threading.Timer(1.0, write, ("ready", stand_in.pid))
        ready_later.start()
        assert db._wait_until_started(tmp_path, timeout=30)
        ready_later.join()
        pid_file.write_text("")  # caught between the rewrite's truncation and its write: not an exit
        ready_later = threading.Timer(1.0, write, ("ready", stand_in.pid))
        ready_later.start()
        assert db._wait_until_started(tmp_path, timeout=30)
        ready_later.join()
        write("starting", stand_in.pid)
        assert not db._wait_until_started(tmp_path, timeout=1)  # never ready: the wait is bounded
    finally:
        stand_in.kill()
        stand_in.wait()
    write("starting", stand_in.pid)
    assert not db._wait_until_started(tmp_path, timeout=30)  # exited: no wait at all
    os.remove(pid_file)
    assert not db._wait_until_started(tmp_path, timeout=30)  # no server


def test_processes_building_a_new_template_at_once_end_with_one_and_no_leftover(monkeypatch):
    """A new migration's template built by several test processes at once on a fresh server: their renames
    race, the losers drop their copies (whether PostgreSQL says the name exists or its catalog's unique
    index does), and every one of them gets the template's name."""
    admin = db.embedded_server_url()
    schema = scratch.sql.schema("queue") + f"\n-- a schema of this test's own: {os.getpid()} {threading.get_ident()}\n"
    monkeypatch.setattr(scratch.sql, "schema", lambda database: schema)
    start, names, errors = threading.Barrier(6), [], []

    def build() -> None:
        start.wait()
        try:
            names.append(scratch.migrated_template(admin, "queue"))
        except Exception as error:  # noqa: BLE001  (what this test reports)
            errors.append(error)
    threads = [threading.Thread(target=build) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert errors == [] and len(set(names)) == 1 and len(names) == 6
        assert _exists(names[0])
        token = scratch.owned_name(admin, "rq_building").rsplit("_", 1)[0]  # this process's builds' prefix
        with psycopg.connect(db.with_database(admin, "postgres"), autocommit=True) as conn:
            left = conn.execute("SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [token]).fetchall()
        assert left == []
    finally:
        with psycopg.connect(db.with_database(admin, "postgres"), autocommit=True) as conn:
            for name in set(names):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
