"""A chaos report's text, from a made-up run (no database): the shortest history that broke names its
job as the learner can follow it (job-N, the Nth submitted, as the schedule table names it), not by the
UUID the run gave it."""

from __future__ import annotations

import uuid

from reliableq.lab import notebook as nb
from reliableq.lab.chaos import ChaosConfig, ChaosReport, fault_schedule
from reliableq.lab.invariants import Check
from reliableq.lab.timeline import Event


def broken_run() -> ChaosReport:
    """Three jobs; the second was charged twice after its worker crashed during its finalize."""
    config = ChaosConfig(seed=1, jobs=3)
    ids = [uuid.uuid4() for _ in range(3)]
    second = str(ids[1])
    history = [
        Event(0.10, second, "chaos-0.0", 1, "claim", "attempt 1"),
        Event(0.12, second, "charge-service", None, "charge", "created (201)"),
        Event(0.13, second, "chaos-0.0", None, "crash", "during_finalize"),
        Event(0.60, second, "chaos-0.0", 1, "lease_expired", "lease expired"),
        Event(0.61, second, "chaos-1.0", 2, "claim", "attempt 2"),
        Event(0.62, second, "charge-service", None, "charge", "created (201)"),
        Event(0.63, second, "chaos-1.0", 2, "finalize_won", "succeeded"),
    ]
    first = Event(0.05, str(ids[0]), "chaos-0.0", 1, "claim", "attempt 1")
    checks = [Check("every acknowledged job is stored"),
              Check("at most one charge per job and per idempotency key", [{"job_id": ids[1], "charges": 2}])]
    return ChaosReport(config, fault_schedule(config), checks, ids, 1, True, 0.7,
                       {"SUCCEEDED": 3, "DEAD": 0}, [first, *history])


def test_the_shortest_broken_history_names_its_job_by_submission_order():
    report = broken_run()
    text = report.text()
    assert "shortest history that broke (job-2):" in text.splitlines()
    assert not any(str(job_id) in text for job_id in report.job_ids)
    assert report.label(report.job_ids[1]) == "job-2" == report.label(str(report.job_ids[1]))
    assert report.acknowledged == 3


def test_the_schedule_table_names_each_job_as_the_report_does():
    """A learner finds the job a report names in the schedule of faults under the same name."""
    report = broken_run()
    table = nb.schedule_table(report.schedule)
    assert list(table.columns) == ["job", "action", "point"]
    assert table["job"].tolist() == [report.label(report.job_ids[f.job_index]) for f in report.schedule]
