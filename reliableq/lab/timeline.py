"""An experiment's history as one list of events, for tables and charts.

Merged from what PostgreSQL recorded (claims, lease expiries, finalizes won and lost, charge requests)
and from the fault plan (crashes, pauses), all on the machine's wall clock and given as seconds since
the experiment began. It reports; it does not judge.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from reliableq.db import Databases
from reliableq.lab.faults import FaultPlan
from reliableq.lab.ledger import read_rows


@dataclass(frozen=True)
class Event:
    seconds: float  # since the experiment began
    job_id: str
    worker: str  # worker id, "charge-service" or "api"
    attempt: int | None
    # claim | lease_expired | finalize_won | finalize_lost | charge | crash | pause | resume, or a stage's own
    # (reliableq.lab.experiment.Experiment.note): acknowledged | refused | link_cut | primary_killed | promoted |
    # submitted | claimed (one watched job's)
    kind: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


async def collect(databases: Databases, started: datetime, fault_plans: list[FaultPlan] = ()) -> list[Event]:
    """Every event of the experiment that began at `started`, in time order."""
    def since(at: datetime) -> float:
        return round((at - started).total_seconds(), 4)

    events: list[Event] = []
    for a in await read_rows(databases.queue_url, "lab_queue", "job_attempts_all"):
        job, worker, attempt = str(a["job_id"]), a["worker_id"], a["attempt"]
        events.append(Event(since(a["recorded_at"]), job, worker, attempt, "claim", f"attempt {attempt}"))
        outcome = a["outcome"] or ""
        if outcome == "expired" and a["lease_expires_at"]:
            events.append(Event(since(a["lease_expires_at"]), job, worker, attempt, "lease_expired", "lease expired"))
        elif outcome.startswith("lost_") and a["finished_at"]:  # a refused renewal has no finish of its own
            events.append(Event(since(a["finished_at"]), job, worker, attempt, "finalize_lost",
                                f"{outcome.removeprefix('lost_')} refused: stale lease token"))
        elif outcome and a["finished_at"]:
            events.append(Event(since(a["finished_at"]), job, worker, attempt, "finalize_won", outcome))
    for r in await read_rows(databases.charge_url, "lab_charge", "charge_requests_all"):
        events.append(Event(since(r["received_at"]), str(r["job_id"]), "charge-service", None, "charge",
                            f"{r['outcome']} ({r['status_code']})"))
    for plan in fault_plans:
        for t in plan.triggered:
            events.append(Event(since(t.at), str(t.job_id), t.worker_id, None,
                                "crash" if t.action in ("crash", "kill") else t.action, t.point))
    return in_order(events)


def in_order(events: list[Event]) -> list[Event]:
    return sorted(events, key=lambda e: (e.seconds, e.kind))
