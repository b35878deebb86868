"""Loads the SQL in `sql/`: the schemas' numbered migrations and the named queries. The only door SQL
comes through; it does not run anything.

A database's schema is its migrations, `sql/migrations/<database>/NNNN_<what>.sql`, applied in order by
reliableq/db.py apply_schema. Before them one idempotent script per database was re-applied whenever its
text changed; no release was ever tagged (the version stayed 0.1.0), so "a database of the last release"
means one made by any commit's script: migration 1 (the schema when numbering began, kept idempotent) and
migration 2 (what such a database lacks) bring it to what a fresh database gets.

A query file is a sequence of blocks, each opening with `-- name: <query_name>` and a one-line comment
saying what it does, parsed here into a dict. A block opened by `-- fragment: <name>` is no query: its
lines stand wherever a block says `-- include: <name>` (what two queries share, written once). The
core's queries are in `queue.sql` and `charge.sql`; those only the lab runs (ledger, timelines,
invariant checks) in `lab_queue.sql` and `lab_charge.sql`, over the same tables; the benchmark's in
`bench*.sql` and `peers.sql`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
# A wheel carries the folder inside the package; a source checkout has it at the top level.
SQL_DIR = next(p for p in (_PACKAGE_DIR / "sql", _PACKAGE_DIR.parent / "sql") if p.is_dir())

_NAME_MARKER = "-- name:"
_FRAGMENT_MARKER = "-- fragment:"
_INCLUDE_MARKER = "-- include:"
_MIGRATION_FILE = re.compile(r"^(?P<number>[0-9]{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    """One numbered migration of a database's schema: `name` is its file's name without `.sql`."""

    number: int
    name: str
    text: str


@cache
def migrations(database: str) -> tuple[Migration, ...]:
    """The migrations of `database` ('queue' or 'charge') in order (sql/migrations/<database>/)."""
    return migrations_in(SQL_DIR / "migrations" / database)


def migrations_in(folder: Path) -> tuple[Migration, ...]:
    """The migrations in `folder` in order, numbered 1, 2, ... without a gap; a file named otherwise is an
    error, so a misnamed migration is never silently skipped (hidden files, an editor's, are passed over)."""
    found: list[Migration] = []
    for path in sorted(p for p in folder.iterdir() if not p.name.startswith(".")):
        match = _MIGRATION_FILE.match(path.name)
        if match is None:
            raise ValueError(f"{path} is not named NNNN_<what>.sql (lower case): rename it or move it out")
        found.append(Migration(int(match["number"]), path.stem, path.read_text()))
    if [m.number for m in found] != list(range(1, len(found) + 1)):
        raise ValueError(f"the migrations in {folder} are not numbered 1, 2, 3, ... without a gap or a repeat: "
                         + ", ".join(m.name for m in found))
    return tuple(found)


def schema(database: str) -> str:
    """The whole schema of `database` as a fresh database gets it: its migrations' text in order, each
    under a line naming it (a template named by this text's digest changes with any migration)."""
    return "\n".join(f"-- migration {m.name}\n{m.text}" for m in migrations(database))


@cache
def queries(database: str) -> dict[str, str]:
    """The named queries of `sql/<database>.sql` ('queue', 'charge', 'lab_queue', ...), name -> SQL text."""
    return parse_named((SQL_DIR / f"{database}.sql").read_text(), f"{database}.sql")


@cache
def statements(database: str) -> dict[str, str]:
    """The named queries of `sql/<database>.sql` as they are sent to the server: without their comment
    lines. psycopg keeps its parse of a query's text only up to 4,096 bytes, and the fair claim's
    comments alone would take it past that, to be parsed again on every claim."""
    return {name: "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
            for name, text in queries(database).items()}


def parse_named(text: str, source: str) -> dict[str, str]:
    """Name -> SQL of the named blocks in `text`, each fragment it includes in place; `source` names the
    text in errors."""
    queries: dict[str, list[str]] = {}
    fragments: dict[str, list[str]] = {}
    block: list[str] | None = None
    for line in text.splitlines():
        opened = next(((marker, blocks) for marker, blocks in ((_NAME_MARKER, queries), (_FRAGMENT_MARKER, fragments))
                       if line.startswith(marker)), None)
        if opened is not None:
            marker, blocks = opened
            name = line[len(marker):].strip()
            if name in blocks:
                what = "query" if blocks is queries else "fragment"
                raise ValueError(f"{what} {name!r} is defined twice in {source}")
            block = blocks[name] = []
        elif block is not None and (line.startswith(_INCLUDE_MARKER) or not line.startswith("--")):
            block.append(line)

    def expanded(lines: list[str], through: tuple[str, ...] = ()) -> list[str]:
        out: list[str] = []
        for line in lines:
            if not line.startswith(_INCLUDE_MARKER):
                out.append(line)
                continue
            name = line[len(_INCLUDE_MARKER):].strip()
            if name not in fragments or name in through:
                raise ValueError(f"{source}: no fragment named {name!r} to include" if name not in fragments
                                 else f"{source}: fragment {name!r} includes itself")
            out += expanded(fragments[name], (*through, name))
        return out
    return {name: "\n".join(expanded(lines)).strip() for name, lines in queries.items()}
