"""Exercise 11, fairness: write the fair claim, so that one tenant's backlog cannot hold back another
tenant's job. The starter is the fair claim's given parts (the tenants with due work, the claim's turn)
above the first-in-first-out `due` of job_claim_due_skip_locked, which is what stage 11 runs with fairness
off; the reference is the shipped job_claim_due_fair. Both are made from sql/queue.sql, so the exercise
cannot drift from the queue it grades.

The forced schedules: one claim over a job in every state (only due jobs taken, lapsed leases still
taken, with leases on and off); exercise 03's interleavings of claims at the same moment, over due jobs and
over lapsed leases (the fair claim locks in both places); rounds of claims of one and of three jobs by one
claimer, so that nothing but the claim decides, over four tenants (one flooding), a fifth arriving mid-run
and leaving again, and two whose jobs are all still ahead (not waiting, so without a place in a round),
every claim judged against what was due before it (a tenant waiting past its bound, a tenant's second job
before another's first, fewer jobs than asked while more were due); a lone tenant's claim, and claims
while a racing claim holds one tenant's jobs (work-conserving, alone and under contention); and the plan
of a claim over a backlog of BACKLOG jobs and QUIET tenants, rows of `jobs` read counted.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from reliableq import sql
from reliableq.config import Mechanisms
from reliableq.lab.exercises import learner_code, schedules, skip_locked
from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.learner_code import load_queries
from reliableq.lab.exercises.skip_locked import TRY_PARAMS
from reliableq.lab.invariants import Check
from reliableq.lab.pieces import Pieces
from reliableq.lab.scenario import ScenarioParams, ScenarioResult

FILENAME = "fairness.sql"
QUERY = "job_claim_due_fair"
MARK = "-- ✎ fairness: take the due jobs tenant by tenant in turn (this takes the oldest first)"
GIVEN = "    -- given: keep it, use it"
# The shipped fair claim: its given part (the tenants with due work, the turn), what the learner writes
# (lined_up to due), and the shared end (expired, claimed, opened).
_PARTS = re.compile(r"(?P<given>.*?\n)(?P<yours>\), lined_up AS \(.*?\n)(?P<end>\), expired AS \(.*)", re.DOTALL)
# The first-in-first-out claim's `due`, lapsed leases and all.
_FIFO_DUE = re.compile(r"^WITH due AS \(\n(?P<due>.*?\n)\), expired AS \(", re.DOTALL)

HEADER = """-- Exercise 11, fairness. Make the claim take the due jobs tenant by tenant, in turn.
--
-- As it stands, `due` takes the oldest due jobs first (first in, first out): when tenant A has 10,000
-- jobs waiting, tenant B's one job, submitted a moment later, waits until all of A's are claimed
-- (stage 11). Where the line is marked ✎, rewrite `due` (add CTEs before it as you need) so that:
--   1. every tenant with due work gets its oldest due job before any tenant gets a second;
--   2. each claim starts its round one tenant further on, so that with claims of one job every tenant
--      with due work is served once in every K claims (K tenants waiting), whatever the backlogs;
--   3. a claim still takes as many jobs as it asks for whenever that many are due and free (a lone
--      tenant gets them all; when racing claims hold the jobs of the tenants this round serves, other
--      tenants' fill the slots: work-conserving);
--   4. each job is still locked for one claimer, rows another claimer holds skipped (exercise 03), and
--      a RUNNING job whose lease ran out is still taken, first (exercise 04: the starter's second branch);
--   5. no claim reads anyone's whole backlog: a few rows per tenant, through the index
--      jobs_pending_tenant_run_at (tenant, run_at, id) WHERE status = 'PENDING'.
-- Given, above `due`: `waiting`, the tenants with a due PENDING job (one row each, found one index probe
-- per tenant), and `turn`, this claim's `number` (one more than the claim before it, whichever worker
-- made that one). A lateral join, CROSS JOIN LATERAL (SELECT ... LIMIT ... FOR UPDATE SKIP LOCKED), reads
-- one tenant's oldest due jobs. For a remainder write mod(a, b), or %% (psycopg reads a lone % as a
-- parameter; the queue's own claim writes %%).
--
-- Leave `expired`, `claimed` and `opened` as they are. Keep the `-- name:` line.
--
-- Check it with:  reliableq exercise check fairness

"""


def shipped() -> str:
    return sql.queries("queue")[QUERY]


def _parts() -> re.Match:
    parts = _PARTS.fullmatch(shipped())
    if parts is None:
        raise ValueError("the shipped fair claim no longer has its lined_up ... due, expired ... parts")
    return parts


def _starter_claim() -> str:
    fifo = _FIFO_DUE.match(skip_locked.shipped())
    if fifo is None:
        raise ValueError("the shipped first-in-first-out claim no longer begins WITH due AS (...), expired")
    given = _parts()["given"].replace("WITH RECURSIVE tenant_steps AS (\n",
                                      f"WITH RECURSIVE tenant_steps AS (\n{GIVEN}\n")
    given = given.replace("), waiting AS (\n", f"), waiting AS (\n{GIVEN}\n")
    given = given.replace("), turn AS MATERIALIZED (\n", f"), turn AS MATERIALIZED (\n{GIVEN}\n")
    return f"{given}), due AS (\n    {MARK}\n{fifo['due']}{_parts()['end']}"


STARTER = skip_locked.claim_file(HEADER, _starter_claim()).replace(
    f"-- name: {skip_locked.QUERY}", f"-- name: {QUERY}")
REFERENCE = skip_locked.claim_file(HEADER, shipped()).replace(f"-- name: {skip_locked.QUERY}", f"-- name: {QUERY}")

WHY = ("`waiting` numbers the tenants with due work (K of them); the claim's `turn` picks where its round starts, "
       "mod(position - turn, K), so consecutive claims start one tenant further on and, with claims of one job, "
       "each tenant is served once in every K claims, however long anyone's backlog. A lateral join reads each "
       "served tenant's oldest due jobs through the index (tenant, run_at, id), locked, locked rows skipped: two "
       "claims racing for one tenant take its first and its second. Numbering each tenant's jobs (nth) and "
       "taking ORDER BY nth, place gives every tenant its first before anyone's second, and fills the claim "
       "from the tenants with more when others have none left; slots still empty, because racing claims hold "
       "the served tenants' jobs, go to the oldest due jobs of anyone (work-conserving). Leases that ran out are "
       "taken first, as in the first-in-first-out claim: they were someone's turn already. Fair by count of "
       "jobs, not by their cost: a tenant whose jobs take ten times as long gets ten times the worker time.")

HINTS = (
    "Three steps: which tenants this claim serves, in what order; each served tenant's oldest due jobs; "
    "then which of those the claim takes. Start with the first: `waiting` has the tenants. Number them "
    "(row_number() OVER (ORDER BY tenant) - 1) and count them (count(*) OVER ()): where does claim number "
    "`turn.number` start its round?",
    "The tenant at position p goes at place mod(mod(p - turn.number, K) + K, K) (the inner mod may be "
    "negative); the claim serves the first %(limit)s places. For each served tenant, CROSS JOIN LATERAL "
    "(SELECT id, status, lease_token, run_at FROM jobs WHERE jobs.tenant = served.tenant AND status = "
    "'PENDING' AND run_at <= coalesce(%(now)s::timestamptz, now()) ORDER BY run_at, id LIMIT %(limit)s "
    "FOR UPDATE SKIP LOCKED).",
    "Number each tenant's jobs, row_number() OVER (PARTITION BY tenant ORDER BY run_at, id) AS nth, and take "
    "the lapsed leases (the starter's second branch on its own, FOR UPDATE SKIP LOCKED, with nth 0) and those "
    "jobs together: ORDER BY nth, place LIMIT %(limit)s. Slots they leave empty (racing claims hold the served "
    "tenants' jobs) go to the oldest due jobs of anyone not already offered, FOR UPDATE SKIP LOCKED, LIMIT "
    "(SELECT greatest(%(limit)s - count(*), 0) FROM those), last in the order. job_claim_due_fair in "
    "sql/queue.sql is the queue's own.",
)

MECHANISMS = Mechanisms()  # stage 11's switches: every mechanism on
# The switches the domain of job states is claimed under: exercise 03's, and leases off too (the fair claim
# runs wherever fairness is on, and a learner may switch leases off beside it).
SWITCHES = (*skip_locked.SWITCHES, (False, True))


def load(text: str) -> Pieces:
    return Pieces(queue_queries=load_queries(text, FILENAME, (QUERY,)))


# Four tenants; the flood's backlog is the oldest. Each has more than a run can take, so that K stays four
# until the late tenant appears (and then five, until its few jobs are gone).
FLOOD = "tenant-a"
BACKLOGS = {FLOOD: 100, "tenant-b": 40, "tenant-c": 40, "tenant-d": 40}
LATE = "tenant-e"
LATE_JOBS = 3
# Tenants whose jobs are all still ahead (a retry's backoff): not waiting, so they have no place in a round.
# One first by name, where the search for the tenants waiting starts, one between two waiting tenants.
AHEAD = ("retrying", "tenant-b-retrying")
AHEAD_JOBS = 5
# (jobs per claim, claims, after which claim the late tenant's jobs arrive)
ROUNDS = ((1, 80, 60), (3, 20, 8))
HELD_CLAIMS = 3  # claims of two while racing claims hold some jobs: the turns go once round three tenants
LONE = 6  # a lone tenant's due jobs, a claim of LONE_CLAIM of them
LONE_CLAIM = 4
BACKLOG = 5000  # the flood's backlog under the plan's count, beside QUIET tenants of QUIET_JOBS each
QUIET = 100
QUIET_JOBS = 3
BACKLOG_CLAIM = 2
# Rows of `jobs` a claim of BACKLOG_CLAIM may read: a probe per tenant waiting, and a few per job it asks
# for. The shipped claim reads QUIET + 7 here (the probes, the jobs it offers, the rows it updates); one
# that reads the flood's backlog reads thousands, one that offers every tenant's jobs (not only the
# served ones') hundreds more.
READS_ALLOWED = QUIET + 1 + 10 * BACKLOG_CLAIM


async def direct(pieces: Pieces, seed: int) -> list[Check]:
    """Forced on a scratch database, in order: the domain of job states (as exercises 03 and 04 check it);
    rounds of claims over four tenants, a late fifth and two with jobs only ahead (claims of one, then of
    three); a lone tenant's claim; exercise 03's claims at the same moment, while another holds, while another
    reads, over due jobs and over lapsed leases; claims while racing claims hold jobs; the plan's rows read
    over a backlog."""
    claim = pieces.queue_queries[QUERY]
    async with schedules.scratch(MECHANISMS) as scratch:
        # SQL PostgreSQL refuses is said at the learner's line before any schedule runs it.
        await learner_code.try_queries({QUERY: claim}, FILENAME, scratch.url, TRY_PARAMS)
        runs = [await schedules.claim_over_every_state(scratch, claim, reclaim, enforce)
                for reclaim, enforce in SWITCHES]
        # One claimer first (what the claim takes, whatever its lock), then claimers racing (its locks): a
        # claim that takes too few jobs is told so before a race shows it as a claimer taking too few.
        rounds = [await _rounds(scratch, claim, per_claim, claims, late_after)
                  for per_claim, claims, late_after in ROUNDS]
        lone = await _lone_tenant(scratch, claim)
        locks = []
        for layout in (skip_locked.DUE, skip_locked.LAPSED):  # the fair claim locks in two places
            await scratch.run("lab_jobs_clear")
            locks += await skip_locked.read_at_the_same_moment(scratch, claim, layout)
            await scratch.run("lab_jobs_clear")
            locks.append(await skip_locked.claimed_while_another_holds(scratch, claim, layout))
            await scratch.run("lab_jobs_clear")
            locks.append(await skip_locked.claimed_while_another_reads(scratch, claim, layout))
        held = await _jobs_held(scratch, claim)
        reads = await _rows_read(scratch, claim)
    return [*schedules.domain_checks(runs, closing=True), *_round_checks(rounds), lone, *locks, held, reads]


@dataclass
class Rounds:
    """Claims of `per_claim` made one after another by one claimer, each judged against the jobs due
    before it (every job laid out is due: nothing else claims them)."""

    per_claim: int
    late_after: int
    starved: list[dict] = field(default_factory=list)  # a tenant that waited past one round
    late_starved: list[dict] = field(default_factory=list)  # ... the tenant that appeared mid-run
    seconds_first: list[dict] = field(default_factory=list)  # a tenant's second job before another's first
    short: list[dict] = field(default_factory=list)  # fewer jobs than asked while more were due


async def _rounds(scratch: schedules.Scratch, claim: str, per_claim: int, claims: int, late_after: int) -> Rounds:
    await scratch.run("lab_jobs_clear")
    due: Counter[str] = Counter()
    tenant_of: dict = {}
    for ago, (tenant, n) in enumerate(BACKLOGS.items()):
        rows = await scratch.run("lab_jobs_backlog", {"tenants": [tenant], "n": n, "ago_seconds": 600 - 60 * ago})
        tenant_of |= {row["id"]: tenant for row in rows}
        due[tenant] += n
    for tenant in AHEAD:
        rows = await scratch.run("lab_jobs_backlog", {"tenants": [tenant], "n": AHEAD_JOBS,
                                                      "ago_seconds": -schedules.HOUR})
        tenant_of |= {row["id"]: tenant for row in rows}
    result = Rounds(per_claim, late_after)
    # Per tenant with due work, since it was last served: others' jobs claimed, the most tenants waiting, and
    # how often the set of tenants waiting changed (a tenant arriving or running out moves every other
    # tenant's place in the round: each change may cost one round more).
    waited: Counter[str] = Counter()
    most: Counter[str] = Counter()
    changes: Counter[str] = Counter()
    before: set[str] = set()
    async with await scratch.connect() as conn:
        for number in range(1, claims + 1):
            waiting = {tenant for tenant, n in due.items() if n > 0}
            stayed = waiting & before if waiting != before else set()  # the tenants whose places moved
            before = waiting
            taken = await schedules.claim_once(conn, claim, worker_id="claimer", limit=per_claim,
                                               reclaim_expired=True, enforce_budget=True)
            by_tenant = Counter(tenant_of.get(row["id"], "?") for row in taken)
            said = f"{number} ({per_claim} job{'s' * (per_claim > 1)} each)"
            took = ", ".join(f"{n} of {tenant}'s" for tenant, n in sorted(by_tenant.items())) or "nothing"
            due -= by_tenant
            if len(taken) < min(per_claim, sum(due.values()) + len(taken)):
                result.short.append({"claim": said, "took": took, "jobs due": sum(due.values()) + len(taken)})
            if any(n > 1 for n in by_tenant.values()) and waiting - set(by_tenant):
                result.seconds_first.append({"claim": said, "took": took,
                                             "gave none to": ", ".join(sorted(waiting - set(by_tenant)))})
            for tenant in sorted(waiting):
                if by_tenant[tenant]:
                    waited[tenant] = most[tenant] = changes[tenant] = 0
                    continue
                waited[tenant] += len(taken)
                most[tenant] = max(most[tenant], len(waiting))
                changes[tenant] += tenant in stayed
                rounds = 1 + changes[tenant]
                bound = rounds * most[tenant] * per_claim
                if waited[tenant] > bound:
                    starved = result.late_starved if tenant == LATE else result.starved
                    if not any(row["tenant"] == tenant for row in starved):
                        starved.append({"tenant": tenant, "waited while": f"{waited[tenant]} jobs of others were "
                                        f"claimed (up to claim {said})", "tenants waiting": most[tenant],
                                        "bound": f"{bound} jobs ({rounds} round{'s' * (rounds > 1)})"})
            if number == late_after:
                for job_id in await scratch.submit(LATE_JOBS, tenant=LATE):
                    tenant_of[job_id] = LATE
                due[LATE] += LATE_JOBS
    return result


def _round_checks(rounds: list[Rounds]) -> list[Check]:
    sizes = " and ".join(str(r.per_claim) for r in rounds)
    return [
        Check(f"claims of {sizes} jobs over four tenants, {FLOOD} flooding: no tenant with due work waits longer than "
              "one round (K tenants waiting × the claim's size, in others' jobs): a claim that takes the oldest first, "
              "or starts every round at the same tenant, starves the others", [r for x in rounds for r in x.starved]),
        Check(f"a tenant whose jobs arrive mid-run ({LATE}, after claim {rounds[0].late_after} of the claims of one "
              f"job, and after claim {rounds[1].late_after} of the claims of three) is served within one round of its "
              "arrival",
              [r for x in rounds for r in x.late_starved]),
        Check("a claim gives every tenant with due work its oldest job before it gives any tenant a second",
              [r for x in rounds for r in x.seconds_first]),
        Check("a claim takes as many due jobs as it asks for while that many are due",
              [r for x in rounds for r in x.short]),
    ]


async def _lone_tenant(scratch: schedules.Scratch, claim: str) -> Check:
    """LONE due jobs, all one tenant's; a claim of LONE_CLAIM must take LONE_CLAIM of them."""
    await scratch.run("lab_jobs_clear")
    await scratch.run("lab_jobs_backlog", {"tenants": [FLOOD], "n": LONE, "ago_seconds": 60})
    async with await scratch.connect() as conn:
        taken = await schedules.claim_once(conn, claim, worker_id="claimer", limit=LONE_CLAIM,
                                           reclaim_expired=True, enforce_budget=True)
    wrong = [] if len(taken) == LONE_CLAIM else [{"jobs due": f"{LONE}, all {FLOOD}'s", "asked for": LONE_CLAIM,
                                                  "took": len(taken)}]
    return Check("a lone tenant gets every slot of a claim (work-conserving): one job per tenant per claim leaves "
                 "workers idle while jobs wait", wrong)


async def _jobs_held(scratch: schedules.Scratch, claim: str) -> Check:
    """Racing claims hold jobs while claimer B claims HELD_CLAIMS times, two jobs each: one holds all of
    tenant-a's (FOR UPDATE, as a claim between its read and its commit), another tenant-c's two oldest with a
    lock claimers share (FOR SHARE, as a claim whose lock is too weak); tenant-b has one job due, tenant-c
    more. The turns go round the three tenants, so some claim's round serves tenant-a and tenant-b: its
    second slot must be filled from tenant-c, past the held jobs, without waiting, and not with the job it
    already took. Every claim must take two jobs none of the others hold."""
    await scratch.run("lab_jobs_clear")
    held_ids = [row["id"] for row in await scratch.run("lab_jobs_backlog", {"tenants": [FLOOD], "n": 2,
                                                                            "ago_seconds": 180})]
    await scratch.run("lab_jobs_backlog", {"tenants": ["tenant-b"], "n": 1, "ago_seconds": 120})
    c_ids = [row["id"] for row in await scratch.run("lab_jobs_backlog", {"tenants": ["tenant-c"], "n": 8,
                                                                         "ago_seconds": 60})]
    shared_ids = c_ids[:2]
    wrong = []
    async with (await scratch.connect(autocommit=False) as racing, await scratch.connect(autocommit=False) as sharing,
                await scratch.connect() as conn):
        await racing.execute(schedules.lab_query("lab_jobs_hold"), {"ids": held_ids})
        await sharing.execute(schedules.lab_query("lab_jobs_hold_shared"), {"ids": shared_ids})
        holders = {racing.info.backend_pid: "the racing claim", sharing.info.backend_pid: "the sharing claim"}
        for number in range(1, HELD_CLAIMS + 1):
            said = {"claim": f"{number} (2 jobs each)"}
            task = asyncio.create_task(schedules.claim_once(conn, claim, worker_id="claimer-B", limit=2,
                                                            reclaim_expired=True, enforce_budget=True))
            waits = await schedules.waiting_or_done(scratch, {"claimer-B": (task, conn.info.backend_pid)}, holders)
            if waits:
                await racing.rollback()  # let them go, so that the claim ends
                await sharing.rollback()
                wrong.append(said | {"claimer B": f"waited for {' and '.join(waits['claimer-B'])}"})
                await schedules.outcome(task)
                break
            taken, failed = await schedules.outcome(task)
            ids = {row["id"] for row in taken or ()}
            held = ids & {*held_ids, *shared_ids}
            if failed or len(ids) != 2 or held:
                wrong.append(said | {"took": failed or f"{len(ids)} job{'s' * (len(ids) != 1)}"
                                     + (", some of them held" if held else ""),
                                     "while": f"{FLOOD}'s 2 jobs and tenant-c's 2 oldest were held, and "
                                              "tenant-b's 1 and tenant-c's other 6 free"})
        await racing.rollback()
        await sharing.rollback()
    return Check("a claim fills the slots its round cannot (the served tenants' jobs held by racing claims) with "
                 "other due jobs no one holds, neither waiting nor taking one twice: work-conserving under "
                 "contention, a claim never comes back short while jobs it could take wait", wrong)


async def _rows_read(scratch: schedules.Scratch, claim: str) -> Check:
    """A claim of BACKLOG_CLAIM over the flood's BACKLOG jobs and QUIET other tenants' QUIET_JOBS each, run
    under EXPLAIN ANALYZE and rolled back: the rows of `jobs` its plan read, from the plan's own figures."""
    await scratch.run("lab_jobs_clear")
    await scratch.run("lab_jobs_backlog", {"tenants": [FLOOD], "n": BACKLOG, "ago_seconds": 600})
    await scratch.run("lab_jobs_backlog", {"tenants": [f"quiet-{n:03d}" for n in range(QUIET)], "n": QUIET_JOBS,
                                           "ago_seconds": 60})
    await scratch.run("lab_jobs_analyze")
    async with await scratch.connect(autocommit=False) as conn:
        cursor = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim, {  # noqa: S608 (the claim under test)
            **TRY_PARAMS, "limit": BACKLOG_CLAIM, "worker_id": "claimer", "lease_seconds": 30.0})
        (plan,) = await cursor.fetchone()
        await conn.rollback()
    read = rows_of_jobs_read(plan if isinstance(plan, list) else json.loads(plan))
    wrong = [] if read <= READS_ALLOWED else [
        {"jobs due": f"{BACKLOG + QUIET * QUIET_JOBS} ({BACKLOG} of {FLOOD}'s, {QUIET_JOBS} each of {QUIET} others)",
         "claim of": BACKLOG_CLAIM, "rows of jobs read": read,
         "allowed": f"{READS_ALLOWED} (a probe per tenant, 10 per job asked for)"}]
    return Check("a claim reads a probe per tenant waiting and a few rows per job it takes: never anyone's whole "
                 "backlog (`waiting` finds the tenants, one index probe each), nor the jobs of tenants it does not "
                 "serve", wrong)


def rows_of_jobs_read(plan: list[dict]) -> int:
    """The rows of the jobs table the plan's scans read: each scan node's rows returned and removed by its
    filters, times its loops (EXPLAIN ANALYZE's own figures). The update's own node is not a read."""
    def walk(node: dict) -> int:
        here = 0
        if node.get("Relation Name") == "jobs" and node["Node Type"] != "ModifyTable":
            rows = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0) \
                + node.get("Rows Removed by Index Recheck", 0)
            here = round(rows * node.get("Actual Loops", 1))
        return here + sum(walk(child) for child in node.get("Plans", ()))
    return sum(walk(entry["Plan"]) for entry in plan)


async def scenario(pieces: Pieces, seed: int) -> tuple[Check, ScenarioResult]:
    import reliableq_stages
    await skip_locked.try_claim(pieces, FILENAME, QUERY)
    result = await reliableq_stages.get("fairness").scenario(True, ScenarioParams(seed=seed, pieces=pieces))
    m = result.measurements
    wrong = [] if m["jobs_ahead_of_b"] <= m["fair_bound"] else [
        {"tenant-a's jobs claimed no later than tenant-b's": m["jobs_ahead_of_b"], "one round": m["fair_bound"],
         "tenant-a's backlog": m["backlog_of_a"]}]
    return Check("stage 11's backlog: tenant-b's one job is claimed within one round, however many of tenant-a's "
                 "wait", wrong, note=f"B waited {m['b_waited_seconds']} s"), result


EXERCISE = Exercise(name="fairness", stage_number=11, filename=FILENAME,
                    summary="the fair claim: due jobs tenant by tenant in turn, still one locked statement (SQL)",
                    starter=STARTER, reference=REFERENCE, why=WHY, hints=HINTS, load=load, scenario=scenario,
                    direct=direct)
