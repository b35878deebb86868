"""A stage run's text, from A/H/C/F rows made up here (no database): the verdict names the stage and
its switches, says whether the guarantee held and which mechanism fixes each breach; the table is
aligned; no line is wider than a notebook's output area, and wrapping never splits a word."""

from __future__ import annotations

import uuid

from reliableq.config import Mechanisms
from reliableq.lab.experiment import stage_mechanisms
from reliableq.lab.ledger import JobCounts
from reliableq.lab.notebook import label
from reliableq.lab.scenario import LINE_WIDTH, LOST, MECHANISM_FIXES, ScenarioParams, ScenarioResult

OK = ("SUCCEEDED", 1, 1, 1, 1)
EXPECTED_C2 = "Expected at this stage: C=2 remains until idempotency (stage 06) makes the charge idempotent."


def made_up(mechanism: str | None, on: bool, *rows: tuple[str, int, int, int, int],
            mechanisms: Mechanisms | None = None, measurements: dict | None = None) -> ScenarioResult:
    """A result of the stage adding `mechanism`, with these (status, A, H, C, F) rows, in order."""
    jobs = [JobCounts(uuid.uuid4(), status, a, h, c, f, 5) for status, a, h, c, f in rows]
    return ScenarioResult((mechanism or "naive").replace("_", "-"), mechanism, on,
                          mechanisms or stage_mechanisms(mechanism, on), ScenarioParams(mechanisms=mechanisms),
                          jobs, [], measurements or {})


def test_fencing_on_expects_the_double_charge_until_idempotency():
    """The stage's own fix worked (F=1), and the C=2 left is named as the next stage's."""
    result = made_up("fencing", True, *[("SUCCEEDED", 2, 2, 2, 1)] * 2)
    assert result.verdict() == [
        "Stage 05 fencing with fencing on; the earlier stages' mechanisms on, the later stages' off.",
        "Seed 0, 2 jobs: 2 SUCCEEDED.",
        "The guarantee broke: job-1, job-2 were charged 2 times.",
        EXPECTED_C2,
    ]


def test_a_stage_off_names_its_own_failure_first_then_what_remains():
    result = made_up("fencing", False, ("SUCCEEDED", 2, 2, 2, 2))
    assert result.verdict() == [
        "Stage 05 fencing with fencing off; the earlier stages' mechanisms on, the later stages' off.",
        "Seed 0, 1 job: 1 SUCCEEDED.",
        "The guarantee broke: job-1 was charged 2 times; job-1 was finalized 2 times.",
        "This stage's failure: F=2, which fencing fixes.",
        EXPECTED_C2,
    ]


def test_a_double_claim_is_the_skip_locked_stages_own_failure():
    """Idempotency and fencing are off too, but the earliest stopper that is off explains C=2 and F=2."""
    result = made_up("skip_locked", False, ("SUCCEEDED", 2, 2, 2, 2), ("SUCCEEDED", 2, 2, 2, 2))
    assert result.verdict()[2:] == ["The guarantee broke: job-1, job-2 were charged 2 times; job-1, job-2 "
                                    "were finalized 2 times.",
                                    "This stage's failure: C=2 and F=2, which skip_locked fixes."]
    assert result.fixed_by() == {"skip_locked": ["C=2", "F=2"]}


def test_a_run_that_held_says_so_and_explains_nothing():
    on = made_up("idempotency", True, ("SUCCEEDED", 2, 2, 1, 1))
    assert on.verdict()[2:] == ["The guarantee held."]
    naive = made_up(None, False, OK)
    assert naive.verdict() == ["Stage 01 naive, no mechanism of its own; all mechanisms off.",
                               "Seed 0, 1 job: 1 SUCCEEDED.", "The guarantee held."]
    last = made_up("fairness", True, OK)
    assert last.verdict()[0] == "Stage 11 fairness with fairness on; all other mechanisms on."
    full = made_up(None, True, OK, mechanisms=Mechanisms())  # the naive notebook's contrast run
    assert full.verdict()[0] == "Stage 01 naive, no mechanism of its own; all mechanisms on."


def test_a_load_stage_off_points_at_its_measurements():
    """Backoff's failure is load: the guarantee holds, so the verdict says where to look instead."""
    off = made_up("backoff", False, ("SUCCEEDED", 114, 114, 1, 1), measurements={"attempts_per_second": 298.2})
    assert off.verdict()[2:] == ["The guarantee held.", "With backoff off, this stage's failure is not a "
                                 "broken guarantee: see the measurements."]
    assert made_up("backoff", True, OK).verdict()[2:] == ["The guarantee held."]


def test_unfinished_jobs_are_the_leases_or_the_dead_stages_failure():
    """RUNNING is a stranded claim while leases are off; once they are on, only DEAD's absence leaves
    a job unfinished (caught mid-attempt, or waiting for its next)."""
    stranded = made_up("leases", False, ("RUNNING", 1, 0, 0, 0))
    assert stranded.verdict()[-1] == "This stage's failure: status RUNNING, which leases fixes."
    retrying = made_up("dead", False, ("PENDING", 7, 7, 0, 0), ("RUNNING", 6, 6, 0, 0))
    assert retrying.verdict()[-1] == "This stage's failure: status PENDING and status RUNNING, which dead fixes."
    lost = made_up("commit_before_ack", False, (LOST, 0, 0, 0, 0), OK)
    assert lost.verdict()[0] == "Stage 02 commit-before-ack with commit_before_ack off; all other mechanisms off."
    assert lost.verdict()[2:] == ["The guarantee broke: job-1 was acknowledged but not in the database.",
                                  "This stage's failure: status LOST, which commit_before_ack fixes."]


def test_hand_picked_switches_blame_the_earlier_mechanism_they_turned_off():
    """The panel's checkboxes: fencing's stage with skip_locked also off. C=2 is then stage 03's."""
    switches = stage_mechanisms("fencing", True).without("skip_locked")
    result = made_up("fencing", True, ("SUCCEEDED", 2, 2, 2, 1), mechanisms=switches)
    assert result.verdict()[0] == ("Stage 05 fencing with fencing on; "
                                   "off: skip_locked, idempotency, backoff, dead, semaphore, sync_standby, fairness.")
    assert result.verdict()[-1] == ("Not this stage's failure: C=2 comes from skip_locked (stage 03) "
                                    "being off in this run.")


def test_every_breach_is_explained_by_the_first_stopper_off():
    """All off, on the naive stage: each breach is expected, until the first stage that stops it, and
    every stopper has the words that finish its line. A charge-less success has no stopper: unexplained."""
    result = made_up(None, False, (LOST, 0, 0, 0, 0), ("RUNNING", 1, 0, 0, 0), ("PENDING", 9, 9, 0, 0),
                     ("SUCCEEDED", 2, 2, 2, 2), ("SUCCEEDED", 1, 1, 0, 1))
    assert {m for b in result.breaches() for m in b.stopped_by} <= set(MECHANISM_FIXES)
    assert "job-5 was succeeded without a charge" in result.violations()
    assert [line.split(" until ")[1] for line in result.verdict() if line.startswith("Expected")] == [
        "commit_before_ack (stage 02) commits a job before acknowledging it.",
        "skip_locked (stage 03) lets one worker at a time claim a job.",
        "leases (stage 04) lets a dead worker's claim expire.",
        "dead (stage 08) stops a failing job as DEAD.",
    ]
    with_skip_locked = made_up(None, False, ("SUCCEEDED", 2, 2, 2, 2), mechanisms=Mechanisms.up_to("skip_locked"))
    assert with_skip_locked.fixed_by() == {"fencing": ["F=2"], "idempotency": ["C=2"]}


def test_no_line_is_wider_than_a_notebook_output_area_and_no_word_is_split():
    """Eight jobs broken several ways and a long measurement: wrapped, at spaces only."""
    rows = [("SUCCEEDED", 2, 2, 2, 2)] * 6 + [("RUNNING", 3, 3, 0, 0), (LOST, 0, 0, 0, 0)]
    measurements = {"last_error": "permanent failure: " + "the card was rejected by the issuer " * 4,
                    "claims_by_worker": {"worker-1": 4}}
    result = made_up(None, False, *rows, measurements=measurements)
    for text in (result.summary(), result.report()):
        assert max(len(line) for line in text.splitlines()) <= LINE_WIDTH
    unwrapped = [*result.verdict(), *result.measured()]
    assert max(len(line) for line in unwrapped) > LINE_WIDTH  # so the wrapping above was needed
    assert result.summary().split() == " ".join(unwrapped).split()
    assert "claims_by_worker" not in result.summary()  # lists and dicts are the notebooks' charts


def test_the_report_has_the_table_between_verdict_and_measurements_and_the_summary_has_none():
    result = made_up("backoff", False, ("SUCCEEDED", 114, 114, 1, 1), ("SUCCEEDED", 9, 9, 1, 1),
                     measurements={"outage_requests": 123})
    table = ["job    status       A    H  C  F",
             "job-1  SUCCEEDED  114  114  1  1",
             "job-2  SUCCEEDED    9    9  1  1"]
    assert result.table() == table
    assert result.report().splitlines() == [*result.verdict(), "", *table, "", "Measured:", "  outage_requests=123"]
    assert result.summary().splitlines() == [*result.verdict(), "Measured:", "  outage_requests=123"]
    assert str(result.jobs[0].job_id) not in result.report()


def test_a_run_is_named_as_its_stage_names_it_when_its_switches_are_the_stages_own():
    """A panel passes the switches it shows, the stage's by default: its run is named as the stage's own
    ("semaphore on"), not by the later stages' mechanisms it leaves off; other switches are named by what
    is off, and the naive stage's run with everything on is the full system."""
    semaphore = stage_mechanisms("semaphore", True)
    assert label(made_up("semaphore", True, OK)) == "semaphore on"
    assert label(made_up("semaphore", True, OK, mechanisms=semaphore)) == "semaphore on"
    assert label(made_up("semaphore", True, OK, mechanisms=semaphore.with_flags(semaphore=False))) == "semaphore off"
    assert (label(made_up("semaphore", True, OK, mechanisms=semaphore.with_flags(fencing=False)))
            == "off: fencing, sync_standby, fairness")
    assert label(made_up(None, False, OK)) == "naive"
    assert label(made_up(None, False, OK, mechanisms=Mechanisms())) == "all mechanisms on"
