"""The mutants reviewed as equivalent: per exercise, each mutant that behaves as the reference does, and
why. A mutant the checker passes counts as equivalent only when it is listed here, and only if the
differential run (mutants_differential.py) then finds no input on which it differs from the reference;
otherwise it counts as survived (mutants.py)."""

from __future__ import annotations

_CLAIM = "job_claim_due_skip_locked: "
# The claim's mutants that behave as the reference does, in exercise 03 and 04 alike.
_CLAIM_EQUIVALENT = {
    _CLAIM + "due: lock FOR UPDATE SKIP LOCKED -> FOR NO KEY UPDATE SKIP LOCKED":
        "a right answer: FOR NO KEY UPDATE conflicts with itself, so claimers still exclude each other, and "
        "skip each other's rows",
    _CLAIM + "due: `now()` -> clock_timestamp()": "a right answer: another clock read (issue 22, item 5)",
    _CLAIM + "due: `now()` -> clock_timestamp() #2": "a right answer: another clock read (issue 22, item 5)",
    _CLAIM + "due: `run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <":
        "the boundary instant only: a job due at exactly the claim's now() is taken by the next claim a "
        "moment later; a right answer may write either (tests/exercises/test_leases_exercise.py, PLAIN_NOW)",
    _CLAIM + "due: `lease_expires_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <":
        "as run_at's `<= -> <`: a lease that runs out at exactly the claim's now() is reclaimed a moment later",
    _CLAIM + "due: `status = 'RUNNING'`: = -> >=":
        "admits SUCCEEDED too, whose lease_expires_at job_succeed always sets NULL: never `<= now()`",
    _CLAIM + "expired: `due.status = 'RUNNING'` removed":
        "a PENDING job's token names a claim its retry or replay already closed (retried, dead, expired), so "
        "`outcome IS NULL OR = 'lost_renew'` excludes it; only an unfenced stale retry leaves one open",
    _CLAIM + "expired: `due.status = 'RUNNING'`: = -> <=": "as `due.status = 'RUNNING'` removed: `due` holds only "
                                                      "PENDING and RUNNING jobs, both <= 'RUNNING'",
    _CLAIM + "expired: `due.status = 'RUNNING'`: = -> >=": "`due` holds only PENDING and RUNNING jobs: of those only "
                                                      "RUNNING is >= 'RUNNING'",
    _CLAIM + "expired: `a.outcome = 'lost_renew'`: = -> <=":
        "the claim of a RUNNING job's current token is on record open or lost_renew only (any finalize by its "
        "owner takes the job out of RUNNING), and NULL OR 'lost_renew' <= 'lost_renew' holds for both",
    _CLAIM + "expired: `a.outcome = 'lost_renew'`: = -> >=": "as `= -> <=`: only NULL and 'lost_renew' are met",
    _CLAIM + "expired: `now()` -> clock_timestamp()": "a right answer: the closed claim's finished_at on another clock",
    _CLAIM + "claimed: `now()` -> clock_timestamp()": "a right answer: the expiry from another clock read",
    _CLAIM + "claimed: `now()` -> clock_timestamp() #2": "a right answer: updated_at (and the claim's claimed_at) from "
                                                    "another clock read",
}
_FAIR = "job_claim_due_fair: "
_NEAREST = ("inside the subquery an unqualified column is its own FROM's (`later`, the jobs row probed): "
            "tenant_steps has no such column, so the name means what `later.` says")
_BOUNDARY = ("the boundary instant only: a job due at exactly the claim's now() is taken by the next claim a moment "
             "later (as in the first-in-first-out claim)")
# The fair claim's mutants that behave as the reference does: its own parts, then the end it shares with the
# first-in-first-out claim (expired, claimed), whose reasons are that claim's.
_FAIR_EQUIVALENT = {
    _FAIR + "tenant_steps: `run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <": _BOUNDARY,
    _FAIR + "tenant_steps: `later.run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <": _BOUNDARY,
    _FAIR + "offered: `jobs.run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <": _BOUNDARY,
    _FAIR + "lapsed: `lease_expires_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <":
        "as run_at's `<= -> <`: a lease that runs out at exactly the claim's now() is reclaimed a moment later",
    _FAIR + "tenant_steps: `later.status = 'PENDING'`: `later.status` -> `status`": _NEAREST,
    _FAIR + "tenant_steps: `later.run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: `later.run_at` -> "
            "`run_at`": _NEAREST,
    _FAIR + "tenant_steps: `now()` -> clock_timestamp()": "a right answer: another clock read (issue 22, item 5)",
    _FAIR + "tenant_steps: `now()` -> clock_timestamp() #2": "a right answer: another clock read (issue 22, item 5)",
    _FAIR + "offered: `now()` -> clock_timestamp()": "a right answer: another clock read (issue 22, item 5)",
    _FAIR + "lapsed: `now()` -> clock_timestamp()": "a right answer: another clock read (issue 22, item 5)",
    _FAIR + "offered: lock FOR UPDATE SKIP LOCKED -> FOR NO KEY UPDATE SKIP LOCKED":
        "a right answer: FOR NO KEY UPDATE conflicts with itself, so claimers still exclude each other, and skip "
        "each other's rows",
    _FAIR + "lapsed: lock FOR UPDATE SKIP LOCKED -> FOR NO KEY UPDATE SKIP LOCKED":
        "a right answer: FOR NO KEY UPDATE conflicts with itself, so claimers still exclude each other, and skip "
        "each other's rows",
    _FAIR + "spare: `run_at <= COALESCE(CAST(%(now)s AS timestamptz), now())`: <= -> <": _BOUNDARY,
    _FAIR + "spare: `now()` -> clock_timestamp()": "a right answer: another clock read (issue 22, item 5)",
    _FAIR + "spare: lock FOR UPDATE SKIP LOCKED -> FOR NO KEY UPDATE SKIP LOCKED":
        "a right answer: FOR NO KEY UPDATE conflicts with itself, so claimers still exclude each other, and skip "
        "each other's rows",
    _FAIR + "due: `%(limit)s + 1`: %(limit)s -> %(lease_seconds)s":
        "where the spare's jobs sort cannot matter: the spare is asked only for the slots the lapsed and offered "
        "jobs leave, so whenever it has any, every candidate fits in the claim's LIMIT",
    _FAIR + "lapsed: `status = 'RUNNING'`: = -> >=":
        "admits SUCCEEDED too, whose lease_expires_at job_succeed always sets NULL: never `<= now()`",
    **{_FAIR + description.removeprefix(_CLAIM): reason for description, reason in _CLAIM_EQUIVALENT.items()
       if description.startswith((_CLAIM + "expired: ", _CLAIM + "claimed: "))},
}
_TOKEN_NAMES_THE_JOB = ("the token names the claim: every claim writes a fresh gen_random_uuid() (unique on "
                        "record in job_attempts), so the token condition alone picks this one job")
_WRITTEN_ONCE = ("only the same claim writing again after its own finalize won meets it (the token is still the "
                 "job's): the worker never does (it asks finalize_recorded before trying a lost answer again), and "
                 "the token without the status is a right answer (tests/exercises/test_fencing_exercise.py)")
_ONLY_RUNNING_IS_LIVE = ("renew also needs a live lease, and only a RUNNING job has one: succeed, retry and dead set "
                         "lease_expires_at NULL, and job_dead_expired_exhausted makes DEAD only jobs whose lease "
                         "already ran out")
_NO_WAIT_CYCLE = ("with the token condition a group updates only the rows whose token is its claim's, and only a claim "
                  "replaces a token, and a claim never waits (SKIP LOCKED): two groups can never each wait to update "
                  "a row the other updated, so no lock is needed before the update (the shipped query needs it with "
                  "fencing off). A lock two groups may share does deadlock: FOR SHARE is rejected "
                  "(fencing._groups_sharing_jobs)")
# exercise -> mutant description -> why it behaves as the reference does. A survivor listed here is
# still run against the reference (mutants_differential.py); a difference makes it a survivor again.
EQUIVALENT: dict[str, dict[str, str]] = {
    "backoff": {
        "retry_delay, line 8: 64 -> 65": "the exponent's own cap: base·2^64 and base·2^65 are both far above any cap "
                                         "the worker takes, so min(cap, …) is the cap either way",
        "retry_delay, line 8: 64 -> 63": "as 64 -> 65: base·2^63 is above every cap too (base ≥ 1 ms)",
    },
    "dead": {
        "decide, lines 21 and 23: `if outcome_kind == 'ok':` and `if outcome_kind == 'permanent':` swapped":
            "two early returns on conditions that never hold together: their order cannot matter",
        "decide, lines 23 and 25: `if outcome_kind == 'permanent':` and `if attempts >= max_attempts:` swapped":
            "both return 'dead': whichever is asked first, a case either meets is dead",
    },
    "fencing": {
        'job_renew_lease: renewed: `id = %(job_id)s` removed':
            _TOKEN_NAMES_THE_JOB,
        'job_renew_lease: renewed: `id = %(job_id)s`: = -> <=':
            _TOKEN_NAMES_THE_JOB,
        'job_renew_lease: renewed: `id = %(job_id)s`: = -> >=':
            _TOKEN_NAMES_THE_JOB,
        'job_retry: finalized: `id = %(job_id)s` removed':
            _TOKEN_NAMES_THE_JOB,
        'job_retry: finalized: `id = %(job_id)s`: = -> <=':
            _TOKEN_NAMES_THE_JOB,
        'job_retry: finalized: `id = %(job_id)s`: = -> >=':
            _TOKEN_NAMES_THE_JOB,
        'job_dead: finalized: `id = %(job_id)s` removed':
            _TOKEN_NAMES_THE_JOB,
        'job_dead: finalized: `id = %(job_id)s`: = -> <=':
            _TOKEN_NAMES_THE_JOB,
        'job_dead: finalized: `id = %(job_id)s`: = -> >=':
            _TOKEN_NAMES_THE_JOB,
        'job_succeed: finalized: `jobs.id = owned.job_id` removed':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: = -> <=':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: = -> >=':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: `jobs.id` -> `owned.job_id`':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: finalized: `jobs.id = owned.job_id`: `owned.job_id` -> `jobs.id`':
            _TOKEN_NAMES_THE_JOB + " (jobs.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id` removed':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: = -> <=':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: = -> >=':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: `f.id` -> `owned.job_id`':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        'job_succeed: won: `f.id = owned.job_id`: `owned.job_id` -> `f.id`':
            _TOKEN_NAMES_THE_JOB + " (f.lease_token = owned.lease_token)",
        "job_renew_lease: renewed: `status = 'RUNNING'` removed":
            _ONLY_RUNNING_IS_LIVE,
        "job_renew_lease: renewed: `status = 'RUNNING'`: = -> <=":
            _ONLY_RUNNING_IS_LIVE,
        "job_renew_lease: renewed: `status = 'RUNNING'`: = -> >=":
            _ONLY_RUNNING_IS_LIVE,
        'job_renew_lease: renewed: `lease_expires_at > clock_timestamp()`: > -> >=':
            "the boundary instant only: a lease expiring at exactly the renewal's clock read, live by one reading "
            "and not the other",
        'job_renew_lease: renewed: `clock_timestamp()` -> now()':
            "a right answer: the new expiry from the statement's transaction start, the renewal's first statement "
            "(milliseconds apart)",
        'job_renew_lease: renewed: `clock_timestamp()` -> now() #2':
            "a right answer: updated_at from another clock read",
        'job_renew_lease: renewed: `clock_timestamp()` -> now() #3':
            "the renewal is its transaction's first statement except under a fleet limit (chaos only, behind "
            "job_fleet_renewal_gate), so now() and clock_timestamp() read the same moment to milliseconds; no forced "
            "schedule holds a renewal at the gate",
        'job_succeed: finalized: `now()` -> clock_timestamp()':
            "a right answer: another clock read",
        'job_succeed: finalized: `now()` -> clock_timestamp() #2':
            "a right answer: another clock read",
        'job_succeed: recorded: `clock_timestamp()` -> now()':
            "a right answer: finished_at from another clock read",
        'job_retry: finalized: `now()` -> clock_timestamp()':
            "a right answer: another clock read",
        'job_retry: finalized: `now()` -> clock_timestamp() #2':
            "a right answer: another clock read",
        'job_retry: recorded: `clock_timestamp()` -> now()':
            "a right answer: finished_at from another clock read",
        'job_dead: finalized: `now()` -> clock_timestamp()':
            "a right answer: another clock read",
        'job_dead: finalized: `now()` -> clock_timestamp() #2':
            "a right answer: another clock read",
        'job_dead: recorded: `clock_timestamp()` -> now()':
            "a right answer: finished_at from another clock read",
        'job_succeed: locked: lock FOR UPDATE removed': _NO_WAIT_CYCLE,
        'job_succeed: locked: lock FOR UPDATE -> FOR KEY SHARE':
            _NO_WAIT_CYCLE + "; FOR KEY SHARE does not conflict with an update's own lock: as if none were taken",
        'job_succeed: locked: lock FOR UPDATE -> FOR KEY SHARE SKIP LOCKED':
            _NO_WAIT_CYCLE + "; FOR KEY SHARE conflicts only with FOR UPDATE, which only a claim, a sweep of "
            "exhausted jobs or the pruner takes, each about to take the job from its owner or past it: the group "
            "that skips it has lost it either way",
        'job_succeed: finalized: `jobs.id IN (SELECT id FROM locked)` removed':
            _NO_WAIT_CYCLE + "; nothing then reads the `locked` step, and PostgreSQL does not run a SELECT in WITH "
            "that nothing reads: as if the lock were removed",
        'job_succeed: locked: lock FOR UPDATE -> FOR NO KEY UPDATE':
            "a right answer: FOR NO KEY UPDATE conflicts with itself and with the UPDATE's own lock, so two groups "
            "still lock their rows in id order",
        "job_succeed: finalized: `jobs.status = 'RUNNING'` removed":
            _WRITTEN_ONCE,
        "job_succeed: finalized: `jobs.status = 'RUNNING'`: = -> <=":
            _WRITTEN_ONCE,
        "job_succeed: finalized: `jobs.status = 'RUNNING'`: = -> >=":
            _WRITTEN_ONCE,
        "job_succeed: recorded: `a.outcome IS DISTINCT FROM 'succeeded'` removed":
            _WRITTEN_ONCE,
        "job_succeed: recorded: `a.outcome IS DISTINCT FROM 'retried'` removed":
            _WRITTEN_ONCE,
        "job_succeed: recorded: `a.outcome IS DISTINCT FROM 'dead'` removed":
            _WRITTEN_ONCE,
        "job_retry: finalized: `status = 'RUNNING'` removed":
            _WRITTEN_ONCE,
        "job_retry: finalized: `status = 'RUNNING'`: = -> <=":
            _WRITTEN_ONCE,
        "job_retry: finalized: `status = 'RUNNING'`: = -> >=":
            _WRITTEN_ONCE,
        "job_retry: recorded: `outcome IS DISTINCT FROM 'succeeded'` removed":
            _WRITTEN_ONCE,
        "job_retry: recorded: `outcome IS DISTINCT FROM 'retried'` removed":
            _WRITTEN_ONCE,
        "job_retry: recorded: `outcome IS DISTINCT FROM 'dead'` removed":
            _WRITTEN_ONCE,
        "job_dead: finalized: `status = 'RUNNING'` removed":
            _WRITTEN_ONCE,
        "job_dead: finalized: `status = 'RUNNING'`: = -> <=":
            _WRITTEN_ONCE,
        "job_dead: finalized: `status = 'RUNNING'`: = -> >=":
            _WRITTEN_ONCE,
        "job_dead: recorded: `outcome IS DISTINCT FROM 'succeeded'` removed":
            _WRITTEN_ONCE,
        "job_dead: recorded: `outcome IS DISTINCT FROM 'retried'` removed":
            _WRITTEN_ONCE,
        "job_dead: recorded: `outcome IS DISTINCT FROM 'dead'` removed":
            _WRITTEN_ONCE,
    },
    "idempotency": {
        "charge_insert_once: created: ON CONFLICT DO NOTHING: conflict target removed":
            "charges has two unique indexes, the key's and the primary key's, and the id is a fresh random uuid: "
            "every conflict this insert can meet is on the key",
    },
    "skip-locked": {
        _CLAIM + "due: `%(reclaim_expired)s` removed":
            "the leases exercise's reference is this claim (reclaim always on from stage 04); with leases off the "
            "queue passes lease_seconds NULL, so no claim writes an expiry and no RUNNING lease can have run out",
        **_CLAIM_EQUIVALENT,
    },
    "leases": _CLAIM_EQUIVALENT,  # the same claim, its reclaim always on
    "fairness": _FAIR_EQUIVALENT,
    "sync-standby": {
        "api_session: synchronous_commit on -> remote_apply":
            "a right answer: the commit waits longer (until the standby has replayed the WAL, not only flushed "
            "it), so everything `on` keeps it keeps",
        "api_session: synchronous_commit on -> remote_write":
            "right for the failure the lab stages: the commit waits until the standby's operating system has the "
            "WAL, which survives the primary's death (only both machines losing power together would lose it, "
            "which no process signal can stage); the exercise's why says so",
    },
    "semaphore": {
        "__init__, lines 18 and 19: `self.limit = limit` and `self.in_flight = 0` swapped":
            "two assignments to different attributes, neither reading the other",
    },
}
