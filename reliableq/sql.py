"""Loads the SQL in `sql/`: schemas and named queries. The only door SQL comes through.

A query file is a sequence of blocks, each opening with `-- name: <query_name>` and a one-line
comment saying what it does. This module parses them into a dict; it does not run anything. The core's
queries are in `queue.sql` and `charge.sql`; those only the lab runs (ledger, timelines, invariant
checks) in `lab_queue.sql` and `lab_charge.sql`, over the same tables; the benchmark's in `bench*.sql`
and `peers.sql`.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
# A wheel carries the folder inside the package; a source checkout has it at the top level.
SQL_DIR = next(p for p in (_PACKAGE_DIR / "sql", _PACKAGE_DIR.parent / "sql") if p.is_dir())

_NAME_MARKER = "-- name:"


def schema(database: str) -> str:
    """The idempotent schema script of `database` ('queue' or 'charge')."""
    return (SQL_DIR / f"{database}_schema.sql").read_text()


@cache
def queries(database: str) -> dict[str, str]:
    """The named queries of `sql/<database>.sql` ('queue', 'charge', 'lab_queue', ...), name -> SQL text."""
    return parse_named((SQL_DIR / f"{database}.sql").read_text(), f"{database}.sql")


def parse_named(text: str, source: str) -> dict[str, str]:
    """Name -> SQL of the named blocks in `text`; `source` names the text in errors."""
    named: dict[str, str] = {}
    name = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(_NAME_MARKER):
            if name:
                named[name] = "\n".join(lines).strip()
            name, lines = line[len(_NAME_MARKER):].strip(), []
            if name in named:
                raise ValueError(f"query {name!r} is defined twice in {source}")
        elif name is not None and not line.startswith("--"):
            lines.append(line)
    if name:
        named[name] = "\n".join(lines).strip()
    return named
