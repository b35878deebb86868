"""The pieces of the system a run may replace: named queue and charge-service queries, the retry-delay
policy, the finalize decision, the worker's permits, the order in which the API stores and
acknowledges a submission, and what its sessions commit with.

Empty, a run uses the shipped ones. The exercises put a learner's code here, and the harness hands it
to every worker it makes, to the charge service it starts in this process and (the order) to its
in-process API, so the learner's piece runs inside the real worker, API, queue, charge service and
database. The API and the harness's own reads keep the shipped queries: they are how a run is observed,
not what an exercise grades. What this does not do: check the pieces (reliableq/lab/exercises does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from reliableq.acknowledgement import SubmissionOrder
from reliableq.backoff import RetryDelays
from reliableq.config import WorkerSettings
from reliableq.finalize_decision import FinalizeDecision
from reliableq.permits import ClaimPermits

# How long one statement of a learner's replaced queries may run in a real run, lock waits included. The
# shipped queries take milliseconds and wait for a lock no longer than a held renewal; a learner's that
# waits behind another claimer, or loops, is cancelled with PostgreSQL's own message instead of hanging.
LEARNER_STATEMENT_SECONDS = 10.0


@dataclass(frozen=True)
class Pieces:
    queue_queries: Mapping[str, str] = field(default_factory=dict)  # name in sql/queue.sql -> its new text
    charge_queries: Mapping[str, str] = field(default_factory=dict)  # name in sql/charge.sql -> its new text
    # The worker's retry delays, made from its settings (base, cap, seed); None: the shipped Backoff.
    retry_delays: Callable[[WorkerSettings], RetryDelays] | None = None
    decision: FinalizeDecision | None = None  # succeed, retry or dead; None: the shipped decide
    permits: Callable[[int], ClaimPermits] | None = None  # a worker's permits from its limit; None: Permits
    submission_order: SubmissionOrder | None = None  # the API's accept(store, acknowledge); None: the shipped one
    # What the API's sessions run first with sync_standby on (its synchronous_commit); None: the shipped SET.
    standby_session: str | None = None

    def beside(self, other: Pieces) -> Pieces:
        """These pieces and `other`'s together (an exercise's and those of the stages before it); where
        both replace the same thing, these win."""
        return Pieces(queue_queries={**other.queue_queries, **self.queue_queries},
                      charge_queries={**other.charge_queries, **self.charge_queries},
                      retry_delays=self.retry_delays or other.retry_delays,
                      decision=self.decision or other.decision, permits=self.permits or other.permits,
                      submission_order=self.submission_order or other.submission_order,
                      standby_session=self.standby_session or other.standby_session)


SHIPPED = Pieces()
