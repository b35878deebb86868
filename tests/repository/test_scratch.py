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
# The next process to name a scratch database: naming it hands every leftover to its background droppers.
# It waits for them here, however long the drops take (each waits for a checkpoint, which took minutes
# beside a loaded test run), where a command would wait DROPS_AT_EXIT_SECONDS and leave the rest.
NEXT_OWNER = """
from reliableq import db, scratch
scratch.owned_name(db.server_url(), "rq_next")
assert scratch.drop_pending(timeout=280)
"""


def _maker() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", MAKE_ONE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    return process, process.stdout.readline().strip()


def _exists(name: str) -> bool:
    with psycopg.connect(db.server_url(), autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


@pytest.mark.timeout(330)  # the next owner may wait minutes for its drops (NEXT_OWNER)
async def test_a_killed_owners_database_is_dropped_by_the_next_owner_and_a_live_ones_is_kept():
    killed, orphan = _maker()
    alive, kept = _maker()
    try:
        assert _exists(orphan) and _exists(kept)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        await wait_until(lambda: orphan in scratch.leftover_names(db.server_url()), timeout=10,
                         what="the killed process's session to end")
        assert kept not in scratch.leftover_names(db.server_url())
        subprocess.run([sys.executable, "-c", NEXT_OWNER], capture_output=True, check=True, timeout=300)
        assert not _exists(orphan)
        assert _exists(kept)
    finally:
        for process in (killed, alive):
            process.kill()
            process.wait()
        db.drop_database(db.server_url(), kept)


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
        write("starting", stand_in.pid)
        assert not db._wait_until_started(tmp_path, timeout=1)  # never ready: the wait is bounded
    finally:
        stand_in.kill()
        stand_in.wait()
    write("starting", stand_in.pid)
    assert not db._wait_until_started(tmp_path, timeout=30)  # exited: no wait at all
    os.remove(pid_file)
    assert not db._wait_until_started(tmp_path, timeout=30)  # no server
