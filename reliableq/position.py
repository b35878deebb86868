"""A place in the jobs' (created_at, id) order, and the opaque cursor a client carries it in.

The job listing pages by it (a keyset: each page starts just past where the last ended, so rows inserted
meanwhile shift no page) and the pruner walks by it. A cursor is the position written out in fixed
width, `<16 digits: microseconds since 1970 UTC>.<the id's 32 hex digits>`: every text of that shape is
a place in the order (the listing starts just past it), and anything else is refused. A regular shape,
not base64 of free text, so the API's document can say exactly which cursors it takes (CURSOR_PATTERN).
Positions before 1970 or from 2286 on have no cursor (PostgreSQL's now() gives neither).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

CURSOR_PATTERN = "^[0-9]{16}\\.[0-9a-f]{32}$"
CURSOR_CHARS = 49  # the pattern's only length (Python's `$` would also let a trailing newline match)
_CURSOR = re.compile(CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ListPosition:
    """Where a page of the listing, or a batch of the pruner, ended: its last job's (created_at, id)."""

    created_at: datetime
    id: uuid.UUID

    def cursor(self) -> str:
        since_epoch = self.created_at - _EPOCH
        micros = (since_epoch.days * 86_400 + since_epoch.seconds) * 1_000_000 + since_epoch.microseconds
        return f"{micros:016d}.{self.id.hex}"

    @classmethod
    def from_cursor(cls, cursor: str) -> ListPosition:
        """The position `cursor` names; ValueError (one line) when it is not a cursor's shape."""
        if len(cursor) != CURSOR_CHARS or not _CURSOR.fullmatch(cursor):
            raise ValueError("cursor is not one a page of this listing gave out; list again without it")
        micros, job_id = cursor.split(".")
        return cls(_EPOCH + timedelta(microseconds=int(micros)), uuid.UUID(hex=job_id))
