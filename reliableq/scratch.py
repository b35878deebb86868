"""Scratch databases: fresh, migrated, dropped afterwards, and never left behind.

Tests, lab runs, exercise checks and the benchmark each make many short-lived databases on the same
server. Every one is named for its owner: a process that makes scratch databases holds, for its whole
life, one session with an advisory lock on a random token, and the token is part of each name. PostgreSQL
releases the lock when that session ends, however the process ends (an exit, SIGKILL, a timeout's kill, a
machine switched off). A scratch database whose token nobody holds is a leftover, and the next process to
make scratch databases on that server drops it. Without that, killed checks left thousands behind: 3,000
databases (23 GB) made the embedded server's first start after an unclean stop take over a minute.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import queue
import re
import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql as pgsql

from reliableq import db, sql

# The first key of every owner's advisory lock (the second is the owner's token): "RQ" and 1, so that no
# other use of two-key advisory locks on a shared server is mistaken for an owner.
OWNER_LOCK_CLASS = 0x5251_0001
_OWNED_NAME = re.compile(r"^rq_[a-z0-9_]*?_o(?P<token>[0-9a-f]{8})_[0-9a-f]{6}(?:" + db.CHARGE_SUFFIX + ")?$")


class _Owner:
    """This process's token on one server, and the session that holds its lock."""

    def __init__(self, admin_url: str) -> None:
        self.pid = os.getpid()
        self.token = secrets.randbelow(2**31)
        self.session = db.connect(db.with_database(admin_url, "postgres"), autocommit=True)
        self.session.execute(sql.queries("scratch")["owner_lock"], {"owner_class": OWNER_LOCK_CLASS,
                                                                    "token": self.token})


_owners: dict[str, _Owner] = {}
_owners_lock = threading.Lock()


def owned_name(admin_url: str, prefix: str) -> str:
    """A new database name carrying this process's token on the server at `admin_url`. The first call in a
    process (for that server) takes the owner's lock and hands every leftover to the background dropper."""
    with _owners_lock:
        owner = _owners.get(admin_url)
        if owner is None or owner.pid != os.getpid():  # a forked child is an owner of its own
            owner = _owners[admin_url] = _Owner(admin_url)
            sweep = True
        else:
            sweep = False
    if sweep:
        for leftover in leftover_names(admin_url):  # one by one: the droppers share them out
            _drop_later(admin_url, (leftover,), LEFTOVER)
    return f"{prefix}_o{owner.token:08x}_{uuid.uuid4().hex[:6]}"


def leftover_names(admin_url: str) -> list[str]:
    """The scratch databases on the server whose owner has gone."""
    named = sql.queries("scratch")
    with db.connect(db.with_database(admin_url, "postgres"), autocommit=True) as conn:
        names = [row[0] for row in conn.execute(named["databases"])]
        held = {row[0] for row in conn.execute(named["owners_alive"], {"owner_class": OWNER_LOCK_CLASS})}
    return [name for name in names
            if (match := _OWNED_NAME.match(name)) and int(match["token"], 16) not in held]


@contextmanager
def scratch_databases(prefix: str = "rq_scratch") -> Iterator[db.Databases]:
    """A fresh, migrated queue database and charge database, dropped afterwards: both cloned from this
    server's migrated templates (made once, see migrated_template)."""
    admin_url = db.server_url()
    name = owned_name(admin_url, prefix)
    names = (name, name + db.CHARGE_SUFFIX)
    template_names = (migrated_template(admin_url, "queue"), migrated_template(admin_url, "charge"))
    try:
        urls = [db.create_database(admin_url, n, t) for n, t in zip(names, template_names, strict=True)]
        yield db.Databases(queue_url=urls[0], charge_url=urls[1])
    finally:
        _drop_later(admin_url, names)


@contextmanager
def empty_database(prefix: str) -> Iterator[str]:
    """A fresh database with no schema (a peer's, a template in the making), dropped afterwards; its URL."""
    admin_url = db.server_url()
    name = owned_name(admin_url, prefix)
    try:
        yield db.create_database(admin_url, name)
    finally:
        _drop_later(admin_url, (name,))


# Scratch databases are dropped by background threads, not by the run that used them: a drop waits for
# every session of the database to have exited (a terminated backend under CPU load takes about a second)
# and for a checkpoint (PostgreSQL forces one per DROP DATABASE; under load they queue behind each other),
# and a check makes a dozen pairs. DROPPERS threads drop side by side, so that drops made together share
# a checkpoint (on a quiet server: 44 ms a drop one at a time, 21 ms eight at a time). At exit a process
# waits DROPS_AT_EXIT_SECONDS at most for its own, as a command must not hang on housekeeping (it waited
# a minute under load); what it leaves, or a killed process leaves, the next owner drops (see the
# module's docstring). A process's own drops go before the leftovers it was handed, and only its own are
# waited for at exit: a server holding 300 leftovers (a loaded run's processes each left some) otherwise
# made every command that sweeps them wait its 10 s at exit.
OWN, LEFTOVER = 0, 1  # the order the droppers take them in
_drops: queue.PriorityQueue[tuple[int, int, str, tuple[str, ...]]] = queue.PriorityQueue()
_order = itertools.count()  # first come, first dropped within a priority
_own_pending = 0
_dropper_lock = threading.Lock()
_droppers: list[threading.Thread] = []
DROPPERS = 4
DROPS_AT_EXIT_SECONDS = 10.0


def _drop_later(admin_url: str, names: tuple[str, ...], priority: int = OWN) -> None:
    global _own_pending
    with _dropper_lock:
        if not _droppers:
            for number in range(DROPPERS):
                dropper = threading.Thread(target=_drop_queued, name=f"reliableq-scratch-drops-{number}",
                                           daemon=True)
                dropper.start()
                _droppers.append(dropper)
            atexit.register(drop_pending, DROPS_AT_EXIT_SECONDS)
        _own_pending += priority == OWN
    _drops.put((priority, next(_order), admin_url, names))


def _drop_queued() -> None:
    global _own_pending
    while True:
        priority, _, admin_url, names = _drops.get()
        try:
            for name in names:
                db.drop_database(admin_url, name)
        except (psycopg.Error, db.DatabaseUnavailable):
            pass  # the server went away: the next owner drops what is left
        finally:
            with _dropper_lock:
                _own_pending -= priority == OWN


def drop_pending(timeout: float = DROPS_AT_EXIT_SECONDS) -> bool:
    """Wait until every scratch database of this process handed to the background droppers is dropped (or
    `timeout` passes); whether they all were. Leftovers it was handed are dropped as time allows."""
    deadline = time.monotonic() + timeout
    while _own_pending and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _own_pending


TEMPLATE_PREFIX = "rq_template_"
_templates: dict[tuple[str, str], str] = {}


def migrated_template(admin_url: str, database: str) -> str:
    """The name of a database on the server at `admin_url` holding exactly the current schema of `database`
    ('queue' or 'charge'), made once per schema text and kept: cloning it costs half of creating a database
    and applying the schema, and a check or a lab run makes many.

    Named by the digest of the schema's migrations (their names and text, `sql.schema`), so a new
    migration gets a template of its own. Built under an owned scratch name and renamed when complete, so a
    concurrent process never clones a half-built one (a rename to a name that exists fails, and the loser
    drops its copy), and one whose builder died is a leftover."""
    digest = hashlib.sha256(sql.schema(database).encode()).hexdigest()[:12]
    name = f"{TEMPLATE_PREFIX}{database}_{digest}"
    if (admin_url, name) in _templates:
        return name
    with db.connect(db.with_database(admin_url, "postgres"), autocommit=True) as conn:
        exists = conn.execute(sql.queries("scratch")["database_exists"], {"name": name}).fetchone()
    if not exists:
        building = owned_name(admin_url, "rq_building")
        db.apply_schema(db.create_database(admin_url, building), database)
        with db.connect(db.with_database(admin_url, "postgres"), autocommit=True) as conn:
            try:
                conn.execute(pgsql.SQL("ALTER DATABASE {} RENAME TO {}").format(pgsql.Identifier(building),
                                                                                 pgsql.Identifier(name)))
            # Renames racing each other: the loser gets DuplicateDatabase, or, when both passed the name
            # check at once, the catalog's own unique index (seen in CI: several test processes building
            # a new migration's template on a fresh server).
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(pgsql.SQL("DROP DATABASE {}").format(pgsql.Identifier(building)))
    _templates[(admin_url, name)] = name
    return name

