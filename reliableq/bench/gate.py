"""The benchmark's correctness gate: a run counts only if the queue's invariants held on its databases.

The checks are the chaos suite's (`reliableq.lab.invariants`), read from PostgreSQL once the run settled;
a scenario may waive one that does not apply to it, with the reason, and add its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from reliableq import db
from reliableq.lab import invariants
from reliableq.lab.invariants import Check

UNFINISHED_CHECK = "every job is SUCCEEDED or DEAD"  # the names reliableq.lab.invariants gives them
UNCHARGED_CHECK = "every SUCCEEDED job has its charge"
RECLAIMED_EARLY_CHECK = "no job was reclaimed while its lease was still running"
FINALIZED_ONCE_CHECK = "no stale owner finalized a job; each job was finalized once"

# What a run with one mechanism switched off gives up by design, and is therefore not failed for: only what
# that mechanism exists to keep, where a run without any fault can break it. Without skip_locked two
# workers' read-then-update claims take the same job (the failure stage 3 shows): the second claim lands
# while the first one's lease runs, or after the first finished, and then finalizes the job a second time
# (fencing refuses only a claim that no longer owns the job, and the second claim does). The idempotency
# key still holds each job to one charge, and that check stays. The other switches break nothing in a run
# where no process crashes, pauses or fails, so nothing is waived for them: a broken invariant fails the run.
WAIVED_WHEN_OFF = {
    "skip_locked": {RECLAIMED_EARLY_CHECK: "two claimers may take one job at once",
                    FINALIZED_ONCE_CHECK: "a job claimed again after it finished is finalized again"},
}


async def gate(databases: db.Databases, acknowledged: Iterable[uuid.UUID] = (),
               waive: dict[str, str] | None = None, extra: Iterable[Check] = ()) -> tuple[bool, list[dict[str, Any]]]:
    """Check the stored invariants (plus `extra`) on a settled run. `waive`: check name -> why it does not
    apply to this run (e.g. ingestion runs never execute their jobs). Passed: every other check held."""
    return judged([*await invariants.check_stored(databases, acknowledged), *extra], waive)


def judged(checks: Iterable[Check], waive: dict[str, str] | None = None) -> tuple[bool, list[dict[str, Any]]]:
    """Checks already made, as a run's gate: passed when every one not waived held; each as a row."""
    waive = waive or {}
    rows = [{"name": c.name, "held": c.held, "violations": len(c.violations), "note": c.note,
             "waived": waive.get(c.name, ""), "examples": [_plain(v) for v in c.violations[:3]]} for c in checks]
    return all(r["held"] or r["waived"] for r in rows), rows


def _plain(row: dict) -> dict:
    return {k: v if isinstance(v, int | float | str | None) else str(v) for k, v in row.items()}
