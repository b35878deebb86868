"""The mechanism switches and the tunable settings, as plain values that cross modules.

`Mechanisms` is the lab's central idea: one flag per reliability mechanism, in the order the stages
introduce them. All on is the real system; each flag off reproduces, for real, the naive behaviour the
mechanism guards against. Nothing here guarantees anything by itself; the flags are read by the queue,
the API and the worker.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Mechanisms:
    """Which reliability mechanisms are on. The field order is the order the stages add them."""

    commit_before_ack: bool = True  # off: 202 is sent before the insert commits
    skip_locked: bool = True  # off: claim is a plain read, then a separate update
    leases: bool = True  # off: RUNNING never expires; a crashed worker's job is stranded
    fencing: bool = True  # off: renew/succeed/retry/dead ignore the lease token
    idempotency: bool = True  # off: no idempotency key is sent to the charge service
    backoff: bool = True  # off: a failed job is due again immediately
    dead: bool = True  # off: failures are retried forever, never DEAD
    semaphore: bool = True  # off: the worker claims and starts everything that is due
    # off: the API's commits do not wait for a synchronous standby (synchronous_commit = local), so a
    # job is acknowledged once the primary alone has it. Without a synchronous standby it changes nothing.
    sync_standby: bool = True
    # off: the claim takes the oldest due jobs whoever they are for (first in, first out), so one tenant's
    # backlog holds back every other tenant's job. On: tenant by tenant in turn (with skip_locked).
    fairness: bool = True

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def all_off(cls) -> Mechanisms:
        return cls(**{name: False for name in cls.names()})

    @classmethod
    def up_to(cls, last: str | None) -> Mechanisms:
        """Every mechanism up to and including `last` on, the later ones off (None: all off)."""
        names = cls.names()
        if last is not None and last not in names:
            raise ValueError(f"unknown mechanism {last!r}; expected one of {', '.join(names)}")
        on = names[: names.index(last) + 1] if last else []
        return cls(**{name: name in on for name in names})

    def without(self, *names: str) -> Mechanisms:
        return self.with_flags(**{name: False for name in names})

    def with_flags(self, **flags: bool) -> Mechanisms:
        unknown = set(flags) - set(self.names())
        if unknown:
            raise ValueError(f"unknown mechanism(s) {', '.join(sorted(unknown))}; known: {', '.join(self.names())}")
        return replace(self, **flags)

    def off(self) -> list[str]:
        return [name for name in self.names() if not getattr(self, name)]

    def describe(self) -> str:
        off = self.off()
        return "all mechanisms on" if not off else "off: " + ", ".join(off)


@dataclass(frozen=True)
class WorkerSettings:
    """How a worker runs. Times are in seconds."""

    concurrency: int = 8  # permits: jobs handled at once (with the semaphore on)
    lease_seconds: float = 30.0  # lease length; renewed every lease_seconds / 3
    poll_seconds: float = 0.2  # idle wait between claims when nothing was due
    # Claim as soon as a submission commits (LISTEN on a connection of its own, reliableq/wake.py); the
    # poll stays the fallback. Off: only the poll finds new jobs.
    wake_on_submit: bool = True
    unbounded_claim_limit: int = 1000  # how many jobs one claim takes with the semaphore off
    backoff_base_seconds: float = 0.5  # first retry delay cap; doubles per attempt
    backoff_max_seconds: float = 60.0  # cap on any retry delay
    backoff_seed: int | None = None  # None: system randomness; an int makes jitter reproducible
    shutdown_grace_seconds: float = 10.0  # on SIGTERM: how long in-flight work may still finish
    worker_id: str | None = None  # default: host-pid-n
    fleet_limit: int | None = None  # jobs in flight across all workers on this database; None: no limit
    # Longest wait for a database connection: a claim waiting when an outage ends gives way this soon to a
    # new one, which the pool serves with a fresh connection.
    db_wait_seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        for name in ("lease_seconds", "poll_seconds", "backoff_base_seconds", "backoff_max_seconds", "db_wait_seconds"):
            if not getattr(self, name) > 0:  # written so that NaN fails too
                raise ValueError(f"{name} must be positive")
        if self.fleet_limit is not None and self.fleet_limit < 1:
            raise ValueError("fleet_limit must be at least 1")
        if self.shutdown_grace_seconds < 0:
            raise ValueError("shutdown_grace_seconds must not be negative")

    def with_id(self, worker_id: str) -> WorkerSettings:
        return replace(self, worker_id=worker_id)


DEFAULT_MAX_ATTEMPTS = 5  # attempt budget of a job (stage `dead`)
DEFAULT_REPLAY_BUDGET = 5  # fresh attempts a replayed DEAD job gets
# How long a client's idempotency key names the job it made: longer than any client keeps retrying.
DEFAULT_SUBMISSION_KEY_WINDOW_SECONDS = 24 * 3600
MAX_PAYLOAD_BYTES = 16 * 1024  # larger submissions are refused with 413
MAX_BATCH_JOBS = 1000  # jobs in one POST /v1/jobs/batch; more are refused with 422
MAX_BATCH_BYTES = 2 * 1024 * 1024  # bytes of one batch body (2 MiB); larger batches are refused with 413
