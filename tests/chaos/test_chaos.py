"""The seeded chaos suite: invariants hold with every mechanism on, and each of the nine mechanisms it can
show switched off breaks the invariant it exists for. Short leases keep the whole file to about a minute."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reliableq.config import Mechanisms
from reliableq.lab.chaos import FLOOD_TENANT, SHOWN_BY_CHAOS, ChaosConfig, fault_schedule, run_chaos, tenant_mix
from reliableq.lab.invariants import FAIRNESS

SEED = 1
FAST = dict(seed=SEED, jobs=120, workers=3, lease_seconds=0.5, settle_seconds=20.0)

# The invariant each mechanism exists for, as the report names it.
BROKEN_WITHOUT = {
    "commit_before_ack": "every acknowledged job is stored",
    "skip_locked": "no job was reclaimed while its lease was still running",
    "leases": "every job is SUCCEEDED or DEAD",
    "fencing": "no stale owner finalized a job; each job was finalized once",
    "idempotency": "at most one charge per job and per idempotency key",
    "backoff": "retries backed off during the outage (at most 5 requests from any job)",
    "dead": "attempt budgets held",
    "semaphore": "in-flight work never exceeded capacity (4 per worker)",
    "fairness": FAIRNESS,
}


def test_chaos_shows_every_mechanism_but_the_standbys():
    """Each mechanism a chaos run can show off has the invariant it breaks below; sync_standby needs a
    standby, which chaos does not run (its stage and `reliableq chaos --failover` show it)."""
    assert list(BROKEN_WITHOUT) == list(SHOWN_BY_CHAOS) == [m for m in Mechanisms.names() if m != "sync_standby"]


def test_same_seed_gives_the_same_fault_schedule():
    """The schedule is a function of the seed alone; another seed gives another schedule."""
    assert fault_schedule(ChaosConfig(seed=5)) == fault_schedule(ChaosConfig(seed=5))
    assert fault_schedule(ChaosConfig(seed=5)) != fault_schedule(ChaosConfig(seed=6))
    kinds = {f.action for f in fault_schedule(ChaosConfig(seed=5))}
    assert kinds == {"crash", "pause", "api_crash", "poison", "slow_commit", "slow_renewal", "lost_answer"}


def test_the_seed_decides_the_tenant_mix_and_leaves_the_fault_schedule_alone():
    """One tenant floods, its jobs submitted first; three quiet tenants follow with 3 to 8 jobs each (at
    most a quarter of the run), in an order the seed shuffles; the faults are the same with one tenant."""
    config = ChaosConfig(seed=5)
    mix = tenant_mix(config)
    assert mix == tenant_mix(ChaosConfig(seed=5)) != tenant_mix(ChaosConfig(seed=6))
    quiet = [tenant for tenant in mix if tenant != FLOOD_TENANT]
    assert mix == [FLOOD_TENANT] * (len(mix) - len(quiet)) + quiet and len(mix) == config.jobs
    assert sorted(set(quiet)) == ["quiet-1", "quiet-2", "quiet-3"] and len(quiet) <= config.jobs // 4
    assert all(3 <= quiet.count(tenant) <= 8 for tenant in set(quiet))
    assert tenant_mix(ChaosConfig(seed=5, quiet_tenants=0)) == [FLOOD_TENANT] * config.jobs
    assert fault_schedule(config) == fault_schedule(ChaosConfig(seed=5, quiet_tenants=0))


@pytest.mark.parametrize("seed", range(30))
def test_every_seed_schedules_each_kind_of_fault(seed):
    """Whatever the seed, a small run schedules each kind of fault at least once (a poison job included,
    or nothing could break an attempt budget), the held-back steps early enough that a backlog is still
    being claimed when they happen."""
    config = ChaosConfig(seed=seed, jobs=40)
    kinds = {f.action for f in fault_schedule(config)}
    assert kinds == {"crash", "pause", "api_crash", "poison", "slow_commit", "slow_renewal", "lost_answer"}
    assert len({f.job_index for f in fault_schedule(config)}) == len(fault_schedule(config))


async def test_every_invariant_holds_with_all_mechanisms_on():
    """Crashes at all three points, pauses past the lease, 503s and 422s: every invariant holds."""
    report = await run_chaos(ChaosConfig(**FAST))
    assert report.ok, report.text()
    assert report.settled and report.restarts > 0
    assert {f.point for f in report.schedule if f.action == "crash"} == {
        "after_claim_before_effect", "after_effect_before_finalize", "during_finalize"}
    assert report.status_counts["SUCCEEDED"] + report.status_counts["DEAD"] == report.acknowledged
    assert BROKEN_WITHOUT["backoff"] in [check.name for check in report.checks]  # the outage happened


async def test_a_fleet_limit_holds_while_renewals_race_fleet_claims():
    """Fleet limit 4 for 3 workers of 4 permits: renewals held inside their transactions past the lease
    while the others claim; live leases never exceed the limit, and every other invariant holds."""
    report = await run_chaos(ChaosConfig(**FAST, fleet_limit=4))
    assert report.ok, report.text()
    assert "live leases never exceeded the fleet limit (4)" in [check.name for check in report.checks]


async def test_many_permits_and_a_short_lease_do_not_trip_the_checker_itself():
    """144 handlers at once (3 workers of 48 permits) on a short lease: the run settles and is judged on
    the invariants, not aborted by its own connection pool. 1.5 s, not 0.5 s: every worker here shares
    one process, and 144 renewals every sixth of a second are most of a core; on a loaded machine they
    ran late and leases were lost (as they would be by any overloaded worker)."""
    report = await run_chaos(ChaosConfig(**(FAST | {"lease_seconds": 1.5}), concurrency=48))
    assert report.settled and report.ok, report.text()


@pytest.mark.parametrize("seed", [2, 3])
async def test_no_waiting_tenant_is_passed_over_past_the_bound_with_the_fair_claim(seed):
    """Other seeds, other mixes and schedules: the fair claim keeps every waiting tenant within the bound
    (seed 1 is the run above)."""
    report = await run_chaos(ChaosConfig(**(FAST | {"seed": seed})))
    (fairness,) = [check for check in report.checks if check.name == FAIRNESS]
    assert fairness.held, report.text()


@pytest.mark.parametrize("mechanism", list(BROKEN_WITHOUT))
async def test_switching_a_mechanism_off_names_the_invariant_that_breaks(mechanism):
    """With one mechanism off, the report names exactly the invariant that mechanism protects."""
    overrides = {"settle_seconds": 4.0} if mechanism in ("leases", "dead") else {}
    if mechanism == "dead":
        # Poison jobs must outrun their budget within the settle time: a short outage keeps the backoff
        # (twice the outage) short. With the default, a fast run sometimes settled first.
        overrides |= {"outage_seconds": 0.1}
    if mechanism == "backoff":
        # Long enough that jobs still in flight when it starts meet it again and again without backoff,
        # with budget left to do so: without backoff a job spends its whole remaining budget in the
        # outage, and with the default 5 attempts that is 4 or 5 requests, within the bound of 5 per job
        # (with 20, 5 to 9 jobs sent 12 to 20 each in seeds 1-3; with backoff, at most 3). 3 s, not 1:
        # a retry without backoff comes round only as fast as the machine lets it, and beside three
        # other test processes and two CPU burners no job sent more than 5 in 1 s.
        overrides |= {"outage_seconds": 3.0, "max_attempts": 20}
    if mechanism == "fencing":
        # Stale owners need pauses that outlive the lease and are not cut short by a crash.
        overrides |= {"pause_rate": 0.15, "crash_rate": 0.01}
    config = ChaosConfig(**(FAST | overrides), mechanisms=Mechanisms().without(mechanism))
    report = await run_chaos(config)
    broken = [check.name for check in report.checks if not check.held]
    assert BROKEN_WITHOUT[mechanism] in broken, report.text()
    assert f"VIOLATED with seed {SEED}" in report.text()
    # A per-job invariant's history names its job as submitted (the semaphore's is not per job).
    if report.shortest_broken_history():
        assert "shortest history that broke (job-" in report.text()
    assert not any(str(job_id) in report.text() for job_id in report.job_ids)


@pytest.mark.slow
def test_chaos_command_exits_non_zero_on_a_violation():
    """`reliableq chaos` prints the report; exit 0 when invariants hold, 1 naming the broken one."""
    args = [sys.executable, "-m", "reliableq", "chaos", "--seed", "3", "--jobs", "40", "--lease", "0.5"]
    ok = subprocess.run(args + ["--fleet-limit", "5"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "all invariants held" in ok.stdout and "live leases never exceeded the fleet limit (5)" in ok.stdout
    broken = subprocess.run(args + ["--off", "idempotency"], capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1
    assert "BROKEN" in broken.stdout and "one charge per job" in broken.stdout
    assert "shortest history that broke (job-" in broken.stdout
