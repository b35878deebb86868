"""The fairness invariant's reading of the ledger (sql/lab_queue.sql job_claims_with_bounds and
job_waits_with_bounds, reliableq/lab/invariants.py fairness_check) on histories made claim by claim on real
PostgreSQL: a waiting tenant passed over by more claims in a row than the bound allows is named, one passed
over by exactly the bound is not, and a run the ledger cannot vouch for is not judged."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reliableq import sql
from reliableq.config import Mechanisms
from reliableq.lab import invariants
from reliableq.lab.invariants import ClaimBounds, WaitBounds, fair_bound, runs_past_waiting_tenants
from reliableq.payload import Submission
from reliableq.queue import Queue
from tests.conftest import wait_until_lease_ran_out

FIFO = Mechanisms().without("fairness")
LEASE = 30.0


def job_of(tenant: str) -> Submission:
    return Submission(payload={"amount_cents": 1250, "currency": "USD"}, kind="charge", tenant=tenant)


async def submitted(queue: Queue, tenants: str) -> tuple[list, datetime]:
    """One job per letter of `tenants`, in that order; and a moment by which all had committed."""
    jobs = [await queue.submit(job_of(tenant)) for tenant in tenants]
    return jobs, await queue.database_now()


async def claims_of_one(queue: Queue, claims: int, worker: str = "w1") -> None:
    for _ in range(claims):
        assert await queue.claim(1, worker, LEASE)


def test_the_bound_is_one_round_for_one_worker_and_grows_with_the_racing_claimers():
    assert [fair_bound(tenants, 1) for tenants in (1, 2, 4)] == [0, 1, 3]
    assert [fair_bound(tenants, 3) for tenants in (1, 2, 4)] == [0, 5, 15]


async def test_a_tenant_passed_over_past_the_bound_is_named(make_queue, databases):
    """One worker, two tenants waiting, so the bound is K-1 = 1. First in, first out, B's job waits behind
    two of A's: two claims in a row passed B over, one more than a round of the tenants allows."""
    queue = make_queue(FIFO)
    (_, _, b_job), visible_from = await submitted(queue, "AAB")
    await claims_of_one(queue, 3)
    check = await invariants.fairness_check(databases, workers=1, visible_from=visible_from)
    assert not check.held and check.name == invariants.FAIRNESS
    (row,) = check.violations
    assert (row["tenant"], row["job_id"], row["passed_over_by"], row["tenants_waiting"], row["bound"]) == (
        "B", b_job.id, 2, 2, 1)
    # Two claimers might have raced: then the same history is within the bound.
    assert (await invariants.fairness_check(databases, workers=2, visible_from=visible_from)).held


async def test_a_tenant_passed_over_by_exactly_the_bound_holds(make_queue, databases):
    """A's one job, then B's: one claim passed B over, which is the bound for two tenants and one worker."""
    queue = make_queue(FIFO)
    _, visible_from = await submitted(queue, "AB")
    await claims_of_one(queue, 2)
    check = await invariants.fairness_check(databases, workers=1, visible_from=visible_from)
    assert check.held, check.violations
    assert check.note == "longest: 1 claim(s) past B while 2 tenants waited; bound 1 with 1 workers"


async def test_the_fair_claim_holds_where_first_in_first_out_breaks(make_queue, databases):
    """Three tenants' backlogs submitted one after the other, one worker taking one job a claim: the fair
    claim passes each waiting tenant over at most twice in a row (K-1, K = 3); first in, first out passes
    C over five times, once for each job ahead of its first."""
    queue = make_queue()
    _, visible_from = await submitted(queue, "AAAAABBBBBCCCCC")
    await claims_of_one(queue, 12)
    assert (await invariants.fairness_check(databases, workers=1, visible_from=visible_from)).held


async def test_first_in_first_out_breaks_it_over_the_same_backlogs(make_queue, databases):
    """C is passed over by ten claims, but judged in two runs of five: when A's last job is taken the
    tenants with due work change (from three to two), and a run is never judged across such a change."""
    queue = make_queue(FIFO)
    _, visible_from = await submitted(queue, "AAAAABBBBBCCCCC")
    await claims_of_one(queue, 12)
    check = await invariants.fairness_check(databases, workers=1, visible_from=visible_from)
    worst = {row["tenant"]: (row["passed_over_by"], row["tenants_waiting"], row["bound"]) for row in check.violations}
    assert worst == {"B": (5, 3, 2), "C": (5, 2, 1)}  # C's worse run: five claims, one tenant beside it


# The fair claim with its round stuck at the first tenant by name: a turn that never moves on.
STUCK_ROUND = sql.queries("queue")["job_claim_due_fair"].replace("nextval('job_claim_turns')", "0")


async def test_a_fair_claim_whose_round_never_moves_on_breaks_it(pool, databases):
    """More than first in, first out: with every claim's round starting at A, claims of one job serve A
    until its backlog is gone, and B and C are passed over five times in a row where the bound is two."""
    assert STUCK_ROUND != sql.queries("queue")["job_claim_due_fair"]
    queue = Queue(pool, Mechanisms(), None, {"job_claim_due_fair": STUCK_ROUND})
    _, visible_from = await submitted(queue, "CCCCCBBBBBAAAAA")
    await claims_of_one(queue, 6)
    check = await invariants.fairness_check(databases, workers=1, visible_from=visible_from)
    assert {(row["tenant"], row["passed_over_by"], row["bound"]) for row in check.violations} == {
        ("B", 5, 2), ("C", 5, 2)}


async def test_a_lapsed_lease_taken_between_claims_is_not_judged(make_queue, databases):
    """A claim that took a lapsed lease may have locked the waiting tenant's jobs and taken none (lapsed
    leases come first), so no run is judged across it: B, passed over by three claims in all (A's job, the
    same job again once its lease ran out, A's second), is judged on the one claim either side."""
    queue = make_queue(FIFO)
    _, visible_from = await submitted(queue, "AAB")
    (first,) = await queue.claim(1, "w1", lease_seconds=0.2)
    await wait_until_lease_ran_out(queue, first)
    (again,) = await queue.claim(1, "w1", LEASE)
    assert (again.id, again.attempts) == (first.id, 2)
    await claims_of_one(queue, 2)
    check = await invariants.fairness_check(databases, workers=1, visible_from=visible_from)
    assert check.held, check
    assert check.note == "longest: 1 claim(s) past B while 2 tenants waited; bound 1 with 1 workers"


async def test_the_fair_claim_promises_nothing_while_the_others_come_and_go_so_that_is_not_judged(
        make_queue, pool, databases):
    """Why no run is judged across a change in the tenants with due work: the fair claim recomputes a
    tenant's place from the turn modulo the tenants waiting *now*. Here b waits throughout while a and c
    take turns to have one job due, in step with the turns: on an even turn a and b wait and a is first, on
    an odd one b and c wait and c is first. Ten claims in a row pass b over, and it could go on for ever."""
    queue = make_queue()
    (b_job,), visible_from = await submitted(queue, "b")
    async with pool.connection() as conn:
        for _ in range(10):
            last, called = await (await conn.execute("SELECT last_value, is_called FROM job_claim_turns")).fetchone()
            await queue.submit(job_of("a" if (last + called) % 2 == 0 else "c"))
            (taken,) = await queue.claim(1, "w1", LEASE)
            assert taken.tenant != "b"
    assert (await queue.get(b_job.id)).status == "PENDING"
    check = await invariants.fairness_check(databases, workers=1, visible_from=visible_from)
    assert check.held and check.note == "no judged claim passed over a waiting tenant", check


# The judging itself, on made-up bounds (no database): times are seconds after T0.
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def claim(second: float, tenant: str, lapsed: bool = False) -> ClaimBounds:
    """A claim of one worker at `second`, deciding within 0.1 s, committed before the next second."""
    return ClaimBounds("w1", at(second), at(second + 0.1), at(second + 0.5), lapsed, [tenant])


def first_spell(tenant: str, taken_at: float) -> WaitBounds:
    return WaitBounds(f"{tenant}-job", tenant, at(-1), at(taken_at + 0.5), at(0), at(taken_at + 0.1))


def test_a_run_is_judged_only_while_every_other_tenant_surely_waits_or_surely_does_not():
    """B waits through claims 1 to 3 of A's; C may have had due work (a retry, whose commit nothing bounds)
    from second 2: the run is judged only up to there."""
    claims = [claim(1, "A"), claim(2, "A"), claim(3, "A"), claim(4, "B")]
    waits = [first_spell("A", 3), first_spell("B", 4)]
    (b_run,) = [run for run in runs_past_waiting_tenants(claims, waits, 1) if run["tenant"] == "B"]
    assert (b_run["passed_over_by"], b_run["bound"]) == (3, 1)
    retry = WaitBounds("C-job", "C", at(2.05), None, None, None)
    (b_run,) = [run for run in runs_past_waiting_tenants(claims, [*waits, retry], 1) if run["tenant"] == "B"]
    assert (b_run["passed_over_by"], b_run["from"], b_run["to"]) == (1, at(1), at(1))


def test_a_tenant_counts_among_those_waiting_until_the_claim_that_takes_its_last_job():
    """C's one job waits surely until the claim at second 2 took it: B's run of two claims (A's, C's) was
    judged with three tenants waiting, so within its bound of 2; A's one claim after counts two."""
    claims = [claim(1, "A"), claim(2, "C"), claim(3, "A"), claim(4, "B")]
    waits = [first_spell("A", 3), first_spell("B", 4), first_spell("C", 2)]
    (b_run,) = [run for run in runs_past_waiting_tenants(claims, waits, 1) if run["tenant"] == "B"]
    assert (b_run["passed_over_by"], b_run["tenants_waiting"], b_run["bound"]) == (2, 3, 2)
    only_after = runs_past_waiting_tenants(claims[2:], waits, 1)
    assert [(run["tenant"], run["passed_over_by"], run["tenants_waiting"]) for run in only_after] == [("B", 1, 2)]
