"""Every stage with its mechanism off and on: the off run shows the failure, the on run the guarantee.

Each scenario makes its own scratch databases through the harness (real PostgreSQL, real HTTP on
loopback, real workers) and drops them afterwards. A stage's off and on runs happen once per session
and are shared by the tests that read them; the numbers asserted are the A/H/C/F PostgreSQL recorded.
"""

from __future__ import annotations

import inspect
import logging

import pytest

import reliableq_stages
from reliableq.config import Mechanisms
from reliableq.db import DEFAULT_DB_TIMEOUT_SECONDS
from reliableq.lab.experiment import STAGE_KNOBS, compare, index_stages
from reliableq.lab.faults import CRASH_POINTS
from reliableq.lab.scenario import LINE_WIDTH, LOST, ScenarioParams, ScenarioResult
from reliableq_stages import s07_backoff, s08_dead, s09_semaphore, s11_fairness

PARAMS = ScenarioParams()
NAMES = reliableq_stages.names()
_compared: dict[str, tuple[ScenarioResult, ScenarioResult]] = {}


async def compared(name: str) -> tuple[ScenarioResult, ScenarioResult]:
    """The stage's (off, on) results, run once per session."""
    if name not in _compared:
        _compared[name] = await compare(reliableq_stages.get(name), PARAMS)
    return _compared[name]


def counts(result: ScenarioResult) -> list[tuple[int, int, int, int]]:
    return [(r["A"], r["H"], r["C"], r["F"]) for r in result.rows()]


def statuses(result: ScenarioResult) -> set[str]:
    return {r["status"] for r in result.rows()}


# -- the registry -------------------------------------------------------------------------------------

def test_registry_order_matches_mechanisms():
    """naive first, then one stage per mechanism flag, in the flags' order."""
    assert [s.MECHANISM for s in reliableq_stages.STAGES] == [None, *Mechanisms.names()]
    assert NAMES == ["naive", *(name.replace("_", "-") for name in Mechanisms.names())]
    assert [s.__name__.rsplit(".", 1)[1][:3] for s in reliableq_stages.STAGES] == [f"s{i:02d}" for i in range(1, 12)]


def test_registry_lookup_accepts_the_mechanism_spelling_and_names_the_choices():
    assert reliableq_stages.get("skip_locked") is reliableq_stages.get("skip-locked")
    with pytest.raises(LookupError, match="expected one of naive, commit-before-ack"):
        reliableq_stages.get("retries")


def test_registry_refuses_stages_out_of_order():
    with pytest.raises(ValueError, match="stages must be naive then"):
        index_stages(list(reversed(reliableq_stages.STAGES)))


@pytest.mark.parametrize("name", NAMES)
def test_stage_declares_failure_invariant_and_mechanisms(name):
    """Docstring opens with the stage; with it on, every mechanism up to its own is on; off, only its own is off."""
    stage = reliableq_stages.get(name)
    assert stage.__doc__.startswith(f"Stage {NAMES.index(name) + 1}, {name}:")
    assert all(word in stage.__doc__ for word in ("Failure", "Invariant", "Boundary"))
    assert stage.FAILURE and stage.INVARIANT and "\n" not in stage.FAILURE + stage.INVARIANT
    if stage.MECHANISM is None:
        assert stage.mechanisms(True) == stage.mechanisms(False) == Mechanisms.all_off()
    else:
        assert stage.mechanisms(True) == Mechanisms.up_to(stage.MECHANISM)
        assert stage.mechanisms(False) == Mechanisms.up_to(stage.MECHANISM).without(stage.MECHANISM)


@pytest.mark.parametrize("name", NAMES)
def test_own_knobs_are_the_stage_specific_params_its_source_reads(name):
    """OWN_KNOBS (which the notebook panel leaves enabled) names exactly the stage-specific knobs the
    stage's module reads, so a greyed-out knob is one that really changes nothing."""
    stage = reliableq_stages.get(name)
    source = inspect.getsource(stage)
    assert set(stage.OWN_KNOBS) == {knob for knob in STAGE_KNOBS if f"params.{knob}" in source}


def test_scenario_params_refuse_nonsense():
    assert ScenarioParams().crash_point is None and ScenarioParams(crash_point=CRASH_POINTS[0])
    for bad in ({"jobs": 0}, {"lease_seconds": 0}, {"crash_point": "nowhere"}, {"failure_rate": 1.5},
                {"concurrency": 0}):
        with pytest.raises(ValueError):
            ScenarioParams(**bad)


# -- what holds for every stage with its mechanism on ---------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
async def test_stage_on_finishes_every_job_once(name):
    """With the stage's mechanism on, every job ends SUCCEEDED, finalized exactly once, none lost."""
    _, on = await compared(name)
    assert on.mechanism_on and on.mechanisms == reliableq_stages.get(name).mechanisms(True)
    # Stage 11's `jobs` sizes tenant A's backlog; tenant B submits one more.
    assert len(on.rows()) == (PARAMS.jobs * s11_fairness.BACKLOG_PER_JOB + 1 if name == "fairness" else PARAMS.jobs)
    assert statuses(on) == {"SUCCEEDED"}, on.summary()
    assert all(r["F"] == 1 for r in on.rows()), on.summary()


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(
        strict=True, reason="fencing guards the rows, not the charge: idempotency is still off"))
    if name == "fencing" else name
    for name in NAMES])
async def test_stage_on_holds_the_full_guarantee(name):
    """With the mechanism on, the checker finds nothing: stored, finished, charged once, finalized once."""
    _, on = await compared(name)
    assert on.violations() == [], on.summary()


# -- each stage's own failure and guarantee ----------------------------------------------------------------

async def test_naive_happy_path_counts_all_one_either_way():
    """Nothing fails, so even everything off gives A=H=C=F=1."""
    off, on = await compared("naive")
    for result in (off, on):
        assert result.mechanisms == Mechanisms.all_off()
        assert counts(result) == [(1, 1, 1, 1)] * PARAMS.jobs
        assert result.violations() == []


async def test_commit_before_ack_off_loses_an_acknowledged_job():
    """A crash between the 202 and the commit: the client holds job-1's id, the database never had it."""
    off, on = await compared("commit-before-ack")
    assert off.measurements["api_crashes"] == 1
    assert off.measurements["acknowledged"] == PARAMS.jobs
    assert off.measurements["lost_jobs"] == 1
    assert off.rows()[0] == {"job": "job-1", "status": LOST, "A": 0, "H": 0, "C": 0, "F": 0}
    assert "job-1 was acknowledged but not in the database" in off.violations()
    assert on.measurements["lost_jobs"] == 0
    assert on.measurements["api_crashes"] == 0  # the 202 waits for the commit; the point is never reached
    assert on.measurements["stored"] == PARAMS.jobs


async def test_skip_locked_off_runs_a_job_twice():
    """Both workers read before either updates: each takes every job; no crash needed."""
    off, on = await compared("skip-locked")
    assert counts(off) == [(2, 2, 2, 2)] * PARAMS.jobs
    assert off.measurements["claims_by_worker"] == {"worker-1": PARAMS.jobs, "worker-2": PARAMS.jobs}
    assert counts(on) == [(1, 1, 1, 1)] * PARAMS.jobs
    assert sum(on.measurements["claims_by_worker"].values()) == PARAMS.jobs


async def test_leases_off_strands_a_crashed_workers_jobs():
    """The worker dies after claiming; without leases the jobs stay RUNNING past two lease lengths."""
    off, on = await compared("leases")
    assert statuses(off) == {"RUNNING"}
    assert counts(off) == [(1, 0, 0, 0)] * PARAMS.jobs
    assert off.measurements["leases_waited"] > 2
    assert off.measurements["reclaimed_by_worker_2"] == 0
    # With leases: reclaimed once the lease expired; the crash came before the charge, so C=1.
    assert counts(on) == [(2, 1, 1, 1)] * PARAMS.jobs
    assert on.measurements["reclaimed_by_worker_2"] == PARAMS.jobs
    assert on.measurements["recovery_seconds"] >= PARAMS.lease_seconds * 0.9


async def test_fencing_off_lets_a_stale_finalize_win():
    """The paused worker's finalize lands after the rescuer's: F=2 off, refused and recorded on."""
    off, on = await compared("fencing")
    assert [r["F"] for r in off.rows()] == [2] * PARAMS.jobs
    assert off.measurements["stale_finalizes_won"] == PARAMS.jobs
    assert off.measurements["job_1_attempt_outcomes"] == ["succeeded", "succeeded"]
    assert [r["F"] for r in on.rows()] == [1] * PARAMS.jobs
    assert on.measurements["stale_finalizes_refused"] == PARAMS.jobs
    assert on.measurements["job_1_attempt_outcomes"] == ["lost_succeed", "succeeded"]
    lost = [e for e in on.event_rows() if e["kind"] == "finalize_lost"]
    assert sorted(e["job"] for e in lost) == [f"job-{i}" for i in range(1, PARAMS.jobs + 1)]
    assert {e["worker"] for e in lost} == {"worker-1"}
    # The boundary: both workers charged; fencing cannot take a charge back.
    assert [r["C"] for r in on.rows()] == [2] * PARAMS.jobs


async def test_idempotency_off_charges_twice():
    """A crash after the charge committed: the retry charges again without the key, not with it."""
    off, on = await compared("idempotency")
    assert counts(off) == [(2, 2, 2, 1)] * PARAMS.jobs
    assert off.measurements["duplicate_charges"] == PARAMS.jobs
    assert counts(on) == [(2, 2, 1, 1)] * PARAMS.jobs  # still ran twice: at-least-once execution
    assert on.measurements["duplicate_charges"] == 0


async def test_backoff_off_hammers_the_failing_service():
    """Without backoff every retry is due at once: nothing but the machine's speed limits the requests
    (a rate, shown in the notebook, not asserted: a loaded machine slows the hammering too). With it each
    retry waits a jittered delay under its cap, as recorded by the retry and as observed by the next claim."""
    off, on = await compared("backoff")
    assert off.measurements["retry_ceilings"] == [0.0] * s07_backoff.SCHEDULE_ATTEMPTS
    assert off.measurements["outage_requests"] > PARAMS.jobs  # the jobs did retry during the outage
    assert all(delays and set(delays) == {0.0} for delays in off.measurements["retry_delays"].values())
    assert set(off.measurements["outage_wait_seconds"].values()) == {0.0}

    ceilings = on.measurements["retry_ceilings"]
    assert ceilings[0] == s07_backoff.BACKOFF_BASE_SECONDS and max(ceilings) == s07_backoff.BACKOFF_MAX_SECONDS
    drawn, observed = on.measurements["retry_delays"], on.measurements["retry_schedule"]
    for job, delays in drawn.items():
        assert len(delays) >= 3
        assert all(0 < d <= c for d, c in zip(delays, ceilings, strict=False)), delays
        # The next claim never comes before the delay ran out (the gap is measured from finished_at, read
        # a moment after the now() the delay was added to: hence the slack).
        assert all(seen >= d - 0.1 for seen, d in zip(observed[job], delays, strict=True)), (observed[job], delays)
    assert len({tuple(delays) for delays in drawn.values()}) == len(drawn)  # jittered: no two jobs in lockstep
    assert all(wait > 0 for wait in on.measurements["outage_wait_seconds"].values())
    for result in (off, on):
        assert all((r["status"], r["C"], r["F"]) == ("SUCCEEDED", 1, 1) for r in result.rows())


async def test_dead_off_retries_past_the_budget():
    """A rejected card is retried forever without DEAD; with it, DEAD at once, inspected, replayed, charged once."""
    off, on = await compared("dead")
    assert statuses(off) <= {"PENDING", "RUNNING"}
    assert all(r["A"] >= s08_dead.OBSERVE_ATTEMPTS > s08_dead.BUDGET for r in off.rows())
    assert all(r["C"] == 0 for r in off.rows())
    assert on.measurements["dead_jobs"] == PARAMS.jobs
    assert list(on.measurements["attempts_when_dead"].values()) == [1] * PARAMS.jobs  # permanent: no point retrying
    assert on.measurements["last_error"] == "permanent failure: injected permanent failure: card rejected"
    assert on.measurements["replay_kept_id_and_key"] is True
    assert counts(on) == [(2, 2, 1, 1)] * PARAMS.jobs


async def test_sync_standby_off_loses_what_the_primary_alone_acknowledged():
    """The link to the standby stalled, the primary killed, the standby promoted. Asynchronous: the jobs
    acknowledged during the stall are gone. Synchronous: none was acknowledged during it (each answered
    503 within the API's database timeout), and every acknowledged job is on the promoted server."""
    off, on = await compared("sync-standby")
    assert off.measurements["acknowledged_during_the_cut"] == PARAMS.jobs
    assert off.measurements["lost_jobs"] == PARAMS.jobs
    assert [r["status"] for r in off.rows()] == ["SUCCEEDED"] * PARAMS.jobs + [LOST] * PARAMS.jobs
    assert off.fixed_by() == {"sync_standby": [f"status {LOST}"]}

    assert on.measurements["acknowledged_before_the_cut"] == PARAMS.jobs
    assert (on.measurements["acknowledged_during_the_cut"], on.measurements["refused_during_the_cut"]) == (
        0, PARAMS.jobs)
    assert "503" in on.measurements["refusal"] and "same Idempotency-Key" in on.measurements["refusal"]
    assert on.measurements["slowest_refusal_seconds"] < 3 * DEFAULT_DB_TIMEOUT_SECONDS  # answered, not hung
    assert on.measurements["lost_jobs"] == 0 and counts(on) == [(1, 1, 1, 1)] * PARAMS.jobs

    # The timeline tells the story: each answer in the api lane, the cut, the kill and the promotion in the
    # database lane, in that order; off, the lost jobs' 202s fall between the cut and the kill.
    for run, answers in ((off, ["acknowledged"] * 2 * PARAMS.jobs),
                         (on, ["acknowledged"] * PARAMS.jobs + ["refused"] * PARAMS.jobs)):
        lanes = {lane: [e for e in run.event_rows() if e["worker"] == lane] for lane in ("api", "database")}
        assert [e["kind"] for e in lanes["database"]] == ["link_cut", "primary_killed", "promoted"]
        assert [e["kind"] for e in lanes["api"]] == answers
    cut, killed = (e["seconds"] for e in off.event_rows() if e["kind"] in ("link_cut", "primary_killed"))
    lost = {r["job"] for r in off.rows() if r["status"] == LOST}
    assert {e["job"] for e in off.event_rows() if e["kind"] == "acknowledged" and cut <= e["seconds"] <= killed} == lost


async def test_fairness_off_makes_one_tenants_job_wait_for_anothers_whole_backlog():
    """Tenant A's backlog, then tenant B's one job. First in, first out: every one of A's is claimed before
    B's. Fair: B's is claimed within one round of the two tenants (at most K x L of A's ahead), and every
    job still runs once, with one charge."""
    off, on = await compared("fairness")
    backlog = PARAMS.jobs * s11_fairness.BACKLOG_PER_JOB
    assert off.measurements["backlog_of_a"] == on.measurements["backlog_of_a"] == backlog
    assert off.measurements["jobs_ahead_of_b"] == backlog > off.measurements["fair_bound"]
    assert on.measurements["jobs_ahead_of_b"] <= on.measurements["fair_bound"] == 2 * PARAMS.concurrency
    for run in (off, on):
        assert counts(run) == [(1, 1, 1, 1)] * (backlog + 1)


async def test_b_waits_for_as_backlog_first_in_first_out_and_for_one_round_fair():
    """As A's backlog grows fivefold, B's job waits behind all of it first in, first out, and behind at most
    one round of the two tenants with the fair claim (the notebook's table, at two sizes)."""
    rows = await s11_fairness.waits_by_backlog(PARAMS, (PARAMS.jobs, PARAMS.jobs * 5))
    assert [row["ahead_of_b_fifo"] for row in rows] == [row["backlog_of_a"] for row in rows] == [
        PARAMS.jobs * s11_fairness.BACKLOG_PER_JOB * n for n in (1, 5)]
    assert all(row["ahead_of_b_fair"] <= 2 * PARAMS.concurrency for row in rows)


async def test_fairness_shares_claims_by_count_not_worker_time_and_retries_take_their_own_turns():
    """The boundary: both tenants with a backlog, A's jobs ten times as slow as B's and each failing once,
    two workers under a fleet limit. While both waited, the fair claim gave each about as many claims, A's
    retries among A's own (not B's), yet A's took most of the worker time and of the fleet's slots."""
    a, b = await s11_fairness.shares_by_cost(PARAMS)
    a_jobs, b_jobs = (PARAMS.jobs * s11_fairness.COST_BACKLOG_PER_JOB[t] for t in s11_fairness.TENANTS)
    assert (a["tenant"], b["tenant"]) == s11_fairness.TENANTS
    # Whatever the timing: every job ran, each of A's (and only A's) retried once.
    assert (a["jobs"], a["claims"], a["retries"]) == (a_jobs, 2 * a_jobs, a_jobs)
    assert (b["jobs"], b["claims"], b["retries"]) == (b_jobs, b_jobs, 0)
    # By count: about as many claims each while both waited (a round apart, give or take), and A's retries
    # are among them. Had a retry taken B's turn, B would have had about as many as A's first claims alone.
    shared_a, shared_b = a["claims_while_both_waited"], b["claims_while_both_waited"]
    assert shared_a >= a_jobs and a["retries_while_both_waited"] >= a_jobs // 2, (a, b)
    assert 0.75 <= shared_a / shared_b <= 1.33, (a, b)
    # Not by cost: A's claims cost several times B's, so A had most of the worker time and of the fleet's
    # slots, which between them never held more than the limit.
    assert a["seconds_per_claim"] > 4 * b["seconds_per_claim"], (a, b)
    assert a["worker_share"] > 0.75 > 0.25 > b["worker_share"], (a, b)
    assert a["avg_in_flight"] > 3 * b["avg_in_flight"], (a, b)
    assert a["avg_in_flight"] + b["avg_in_flight"] <= s11_fairness.FLEET_LIMIT + 0.05, (a, b)


async def test_fairness_shares_by_cost_counts_repeat_with_the_seed():
    """What does not depend on timing repeats run after run with the same seed: the jobs, and which of
    them were retried (the charge service refuses the first request of each of A's, by job id)."""
    params = ScenarioParams(seed=1, jobs=1)
    first = await s11_fairness.shares_by_cost(params)
    again = await s11_fairness.shares_by_cost(params)
    counted = ("tenant", "jobs", "claims", "retries")
    assert [{k: row[k] for k in counted} for row in first] == [{k: row[k] for k in counted} for row in again]


async def test_semaphore_off_overloads_the_charge_service():
    """Starting everything due puts more in flight than the service takes; permits keep it within."""
    off, on = await compared("semaphore")
    capacity = s09_semaphore.CHARGE_CAPACITY
    # Every job due is started at once. A retried job may be claimed again (its delay drawn near 0) while
    # its first handler still winds down (its lease keeper stopping): then both are counted for a moment.
    assert off.measurements["in_flight_peak"] >= PARAMS.jobs > capacity
    assert off.measurements["service_in_flight_peak"] > capacity
    assert off.measurements["refused"] > 0
    assert on.measurements["in_flight_peak"] <= PARAMS.concurrency <= capacity
    assert on.measurements["service_in_flight_peak"] <= capacity
    assert on.measurements["refused"] == 0
    assert counts(on) == [(1, 1, 1, 1)] * PARAMS.jobs


# -- reproducibility and the result's shape ---------------------------------------------------------------

async def test_skip_locked_same_seed_same_rows():
    """The race is pinned by events, not timing: the same seed gives the same A/H/C/F rows again."""
    off, _ = await compared("skip-locked")
    again = await reliableq_stages.get("skip-locked").scenario(False, PARAMS)
    assert again.rows() == off.rows()


async def test_idempotency_result_is_tidy():
    """Rows carry job, status, A, H, C, F; events are labelled by job; the summary names the stage."""
    off, _ = await compared("idempotency")
    assert list(off.rows()[0]) == ["job", "status", "A", "H", "C", "F"]
    kinds = {e["kind"] for e in off.event_rows()}
    assert {"claim", "charge", "crash", "lease_expired", "finalize_won"} <= kinds
    assert {e["job"] for e in off.event_rows()} == {f"job-{i}" for i in range(1, PARAMS.jobs + 1)}
    assert [e.seconds for e in off.events] == sorted(e.seconds for e in off.events)
    text = off.summary()
    assert text.splitlines()[0].startswith("Stage 06 idempotency with idempotency off;")
    assert "job-1, job-2, job-3, job-4 were charged 2 times" in text
    assert "A=" not in text and not any(line.startswith("job-") for line in text.splitlines())  # no table
    assert not any(str(c.job_id) in text for c in off.jobs)


async def test_a_runs_log_lines_name_jobs_as_its_tables_do(caplog):
    """The worker's warnings during a stage run say job-1, job-2 (as the tables and charts do), never a
    UUID; after the run, the core's logs are left as they were."""
    result = await reliableq_stages.get("fencing").scenario(True, ScenarioParams(seed=1, jobs=2))
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert sorted(refused) == [f"worker worker-1: finalize (succeed) of job-{n} refused: its lease was lost"
                               for n in (1, 2)]
    assert not any(str(job.job_id) in record.getMessage() for job in result.jobs for record in caplog.records)
    logging.getLogger("reliableq.worker").warning("job %s", result.jobs[0].job_id)
    assert caplog.records[-1].getMessage() == f"job {result.jobs[0].job_id}"



async def test_the_api_crash_line_names_the_job_it_lost_as_the_table_does(caplog):
    """The API logs its crash before the client has read the 202 with the job's id; the line still
    says job-1 (the LOST row), not a UUID the learner could match with nothing."""
    result = await reliableq_stages.get("commit-before-ack").scenario(False, ScenarioParams(seed=1))
    crashes = [r.getMessage() for r in caplog.records if r.name == "reliableq.api"]
    assert crashes == ["simulated API crash after acknowledging job-1: the job is lost"]
    assert result.rows()[0]["job"] == "job-1" and result.rows()[0]["status"] == LOST

# -- the verdict each run prints ---------------------------------------------------------------------------

# Their failure is load: the guarantee holds with the mechanism off, and the measurements show it.
LOAD_STAGES = ("backoff", "semaphore")
# Their failure is waiting: the guarantee holds with the mechanism off, and the verdict checks their own
# invariant on every run, broken off and held on.
WAIT_STAGES = ("fairness",)


@pytest.mark.parametrize("name", NAMES)
async def test_stage_verdict_says_what_each_run_shows(name):
    """Each run's verdict names the stage and its switch, and holds exactly when nothing broke. With the
    mechanism off it claims a failure for it (or, for load, points at the measurements); the on run
    must then show that failure gone. What it expects a later stage to fix must still be there with
    the mechanism on, and is named in an "Expected at this stage" line, which only fencing needs."""
    stage = reliableq_stages.get(name)
    number = NAMES.index(name) + 1
    for result in await compared(name):
        verdict = result.verdict()
        held = result.violations() == []
        assert ("The guarantee held." in verdict) == held and any(v.startswith("The guarantee broke: ")
                                                                  for v in verdict) != held
        expected = [line for line in verdict if line.startswith("Expected at this stage: ")]
        assert len(expected) == (name == "fencing"), verdict
        assert all(len(line) <= LINE_WIDTH for line in result.summary().splitlines())
        if stage.MECHANISM is None:
            assert verdict[0].startswith(f"Stage 01 {name}, no mechanism of its own;")
            continue
        switch = "on" if result.mechanism_on else "off"
        assert verdict[0].startswith(f"Stage {number:02d} {name} with {stage.MECHANISM} {switch};")
        own_line = [line for line in verdict if line.startswith("This stage's failure: ")]
        load_line = f"With {stage.MECHANISM} off, this stage's failure is not a broken guarantee: see the measurements."
        assert bool(own_line) == (not result.mechanism_on and name not in LOAD_STAGES + WAIT_STAGES), verdict
        assert (load_line in verdict) == (not result.mechanism_on and name in LOAD_STAGES), verdict
        invariant = [line for line in verdict if line.startswith("This stage's invariant ")]
        if name in WAIT_STAGES:
            said = "held" if result.mechanism_on else "broke"
            assert [line.startswith(f"This stage's invariant {said}: {stage.INVARIANT}") for line in invariant] \
                == [True], verdict
        else:
            assert invariant == [], verdict

    off, on = await compared(name)
    shown_on = {breach.sign for breach in on.breaches()}
    assert stage.MECHANISM not in on.fixed_by()
    assert not set(off.fixed_by().get(stage.MECHANISM, [])) & shown_on  # the mechanism fixed what it claimed
    later = {fixer: signs for fixer, signs in off.fixed_by().items() if fixer != stage.MECHANISM}
    assert later == on.fixed_by()  # and what it left to later stages remained


async def test_fencing_verdict_expects_the_double_charge_until_idempotency():
    """The fencing stage's on run still charges twice; its verdict says why that is expected here."""
    off, on = await compared("fencing")
    line = "Expected at this stage: C=2 remains until idempotency (stage 06) makes the charge idempotent."
    assert on.verdict()[-1] == line
    assert off.verdict()[-2:] == ["This stage's failure: F=2, which fencing fixes.", line]
