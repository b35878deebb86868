"""A place in the jobs' (created_at, id) order, and the opaque cursor a client carries it in.

The job listing pages by it (a keyset: each page starts just past where the last ended, so rows inserted
meanwhile shift no page) and the pruner walks by it. A cursor is base64url text the API hands out and
takes back unread; one no page gave out is refused, never trusted to name a real job.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class ListPosition:
    """Where a page of the listing, or a batch of the pruner, ended: its last job's (created_at, id)."""

    created_at: datetime
    id: uuid.UUID

    def cursor(self) -> str:
        return base64.urlsafe_b64encode(f"{self.created_at.isoformat()}/{self.id}".encode()).decode().rstrip("=")

    @classmethod
    def from_cursor(cls, cursor: str) -> ListPosition:
        """The position `cursor` names; ValueError (one line) when no page gave it out."""
        try:
            text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            created_at, job_id = text.split("/")
            moment = datetime.fromisoformat(created_at)
            # In UTC: PostgreSQL refuses offsets Python allows (+20:00), and a cursor is anyone's text.
            position = cls(moment.astimezone(UTC), uuid.UUID(job_id)) if moment.tzinfo else None
        except (ValueError, OverflowError):  # binascii and Unicode errors are ValueErrors
            position = None
        if position is None:
            raise ValueError("cursor is not one a page of this listing gave out; list again without it")
        return position
