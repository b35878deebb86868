"""What a stage's scenario takes (ScenarioParams) and what it recorded (ScenarioResult), and how a
result reads: A/H/C/F per job as PostgreSQL recorded them, the timeline, the stage's measurements, and a
verdict judged only against the full system's honest guarantee, read off those rows
(`ScenarioResult.breaches`), so a lesson's verdict is visible in its own table. The verdict names the
mechanism that stops each breach, in the stages' order; the deeper database checks of chaos runs are
`reliableq.lab.invariants`. Its text (the verdict, the table, the summary the notebooks print) is
wrapped to LINE_WIDTH.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reliableq.config import Mechanisms
from reliableq.lab import timeline
from reliableq.lab.faults import CRASH_POINTS
from reliableq.lab.harness import SETTLED_STATUSES
from reliableq.lab.invariants import Check
from reliableq.lab.ledger import JobCounts
from reliableq.lab.pieces import SHIPPED, Pieces

LOST = "LOST"  # the status shown for an acknowledged job the database does not have (never stored, or failed over)
ROW_COLUMNS = ("job", "status", "A", "H", "C", "F")
# Characters per line of a result's text: a JupyterLab output area shows about 100 before it wraps,
# and it wraps anywhere, mid-word.
LINE_WIDTH = 96
# What each mechanism that stops a breach does about it, to finish "remains until <mechanism> ...".
MECHANISM_FIXES = {
    "commit_before_ack": "commits a job before acknowledging it",
    "skip_locked": "lets one worker at a time claim a job",
    "leases": "lets a dead worker's claim expire",
    "fencing": "refuses a finalize from a lost lease",
    "idempotency": "makes the charge idempotent",
    "dead": "stops a failing job as DEAD",
    "sync_standby": "acknowledges a job only once the standby has it",
    "fairness": "claims due jobs tenant by tenant in turn",
}


def job_label(n: int) -> str:
    """The name of a run's nth submitted job (from 1) in every table, chart, log line and report a learner
    reads, where its id is a UUID that means nothing to them and changes from run to run."""
    return f"job-{n}"


def job_labels(job_ids: Iterable[object]) -> dict[str, str]:
    """Job id (as text) -> its job_label, by submission order."""
    return {str(job_id): job_label(n) for n, job_id in enumerate(job_ids, start=1)}


@dataclass(frozen=True)
class ScenarioParams:
    """The knobs every stage's scenario takes. A stage ignores the ones its story does not use."""

    seed: int = 0  # seeds job ids, the charge service's failure draws and the backoff jitter
    jobs: int = 4  # how many jobs the scenario submits
    lease_seconds: float = 1.0  # lease length in seconds; short, so expiry is seen within a run
    crash_point: str | None = None  # a faults.CRASH_POINTS name (stages leases, idempotency); None: the stage's own
    failure_rate: float = 1.0  # probability a charge request fails while the stage's fault is on (backoff, dead)
    concurrency: int = 2  # worker permits: jobs in flight at once (only bites with the semaphore on)
    # Exactly these switches instead of the stage's own set (the notebook panel's checkboxes); None: the
    # stage's mechanisms(on).
    mechanisms: Mechanisms | None = None
    pieces: Pieces = SHIPPED  # a learner's queries or policy in place of the shipped ones (the exercises)

    def __post_init__(self) -> None:
        if self.jobs < 1:
            raise ValueError("jobs must be at least 1")
        if self.lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        if self.crash_point is not None and self.crash_point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {self.crash_point!r}; expected one of {', '.join(CRASH_POINTS)}")
        if not 0.0 <= self.failure_rate <= 1.0:
            raise ValueError("failure_rate must be between 0 and 1")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")


@dataclass(frozen=True)
class Breach:
    """One way one job broke the full system's guarantee, and the mechanisms that stop it."""

    job: str  # job-N
    what: str  # completes "job-1 was ...": "charged 2 times", "left RUNNING"
    sign: str  # how the table shows it: "C=2", "F=2", "status RUNNING"
    # The mechanisms that stop this breach, in stage order. A double claim (skip_locked off) charges
    # and finalizes twice with nothing failing; past it, a rerun after a crash or a pause still does
    # until idempotency (the charge) and fencing (the finalize).
    stopped_by: tuple[str, ...]


@dataclass
class ScenarioResult:
    """What one scenario run recorded. Jobs are in submission order and labelled job-1, job-2, ..."""

    stage: str
    mechanism: str | None  # None for the naive stage
    mechanism_on: bool
    mechanisms: Mechanisms
    params: ScenarioParams
    jobs: list[JobCounts]
    events: list[timeline.Event]
    measurements: dict[str, Any] = field(default_factory=dict)
    # How long the run was watched (seconds since it began, on the timeline's clock): the quiet stretch
    # after the last event is part of the story (a stranded job shows as nothing happening).
    watched_seconds: float | None = None
    # The stage's own invariant, where it is not the guarantee (a wait, a load): checked on every run, said
    # in the verdict.
    stage_checks: list[Check] = field(default_factory=list)

    def labels(self) -> dict[str, str]:
        """Job id -> job-N; labels rather than ids so seeded runs compare equal."""
        return job_labels(c.job_id for c in self.jobs)

    def rows(self) -> list[dict[str, Any]]:
        labels = self.labels()
        return [dict(zip(ROW_COLUMNS, (labels[str(c.job_id)], c.status, c.attempts, c.handler_runs, c.charges,
                                       c.finalizations), strict=True)) for c in self.jobs]

    def event_rows(self) -> list[dict[str, Any]]:
        labels = self.labels()

        def label(job: str) -> str:
            # A claimer's pause names every job it read, as one string of ids.
            return labels.get(job) or ", ".join(v for k, v in labels.items() if k in job) or job
        return [e.as_dict() | {"job": label(e.job_id)} for e in self.events]

    def breaches(self) -> list[Breach]:
        """Where the full system's guarantee broke: every acknowledged job is stored and finishes,
        with at most one charge and at most one finalization (exactly one of each if SUCCEEDED)."""
        found = []
        for row in self.rows():
            job, status, charges, finals = row["job"], row["status"], row["C"], row["F"]
            if status == LOST:
                # Never stored (the 202 went first), or stored on a primary whose standby never had it (a failover).
                found.append(Breach(job, "acknowledged but not in the database", f"status {LOST}",
                                    ("commit_before_ack", "sync_standby")))
            elif status not in SETTLED_STATUSES:
                # A job is left RUNNING by a dead worker's claim that never expires, or caught mid-attempt
                # while it is retried forever; PENDING only by the retrying.
                stopped_by = ("leases", "dead") if status == "RUNNING" else ("dead",)
                found.append(Breach(job, f"left {status}", f"status {status}", stopped_by))
            if charges > 1:
                found.append(Breach(job, f"charged {charges} times", f"C={charges}", ("skip_locked", "idempotency")))
            if finals > 1:
                found.append(Breach(job, f"finalized {finals} times", f"F={finals}", ("skip_locked", "fencing")))
            if status == "SUCCEEDED" and charges == 0:
                found.append(Breach(job, "succeeded without a charge", "C=0", ()))
        return found

    def violations(self) -> list[str]:
        """The breaches as sentences: "job-1 was charged 2 times"."""
        return [f"{b.job} was {b.what}" for b in self.breaches()]

    def fixed_by(self) -> dict[str, list[str]]:
        """The breaches' signs ("C=2") by the mechanism that would have stopped them in this run: the
        first of each breach's stoppers that the run had off. A breach whose stoppers were all on (or
        that has none) is in no list."""
        fixes: dict[str, list[str]] = {}
        for breach in self.breaches():
            fixer = next((m for m in breach.stopped_by if not getattr(self.mechanisms, m)), None)
            if fixer is not None and breach.sign not in fixes.setdefault(fixer, []):
                fixes[fixer].append(breach.sign)
        return fixes

    def verdict(self) -> list[str]:
        """Which run this was, its jobs' statuses, whether the guarantee held, and which mechanism stops
        each breach: this stage's own (the failure it exists for), or a later one (expected here)."""
        own = self.mechanism
        own_on = own is not None and getattr(self.mechanisms, own)
        order = Mechanisms.names()
        if own is None:
            setting = f"Stage {stage_number(None):02d} {self.stage}, no mechanism of its own"
        else:
            setting = f"Stage {stage_number(own):02d} {self.stage} with {own} {'on' if own_on else 'off'}"
        # The other switches, said briefly: a stage's run has the earlier ones on and the later ones off.
        others = [m for m in order if m != own]
        others_off = [m for m in others if not getattr(self.mechanisms, m)]
        if others_off in ([], others):
            # Mechanisms.describe()'s words ("all mechanisms on"), which the tables' run labels use.
            switches = f"all {'other ' if own else ''}mechanisms {'off' if others_off else 'on'}"
        elif self.mechanisms == stage_mechanisms(own, own_on):
            # Not by name: a learner at this stage has not met the later mechanisms.
            switches = "the earlier stages' mechanisms on, the later stages' off"
        else:
            switches = f"{'also off' if own and not own_on else 'off'}: {', '.join(others_off)}"
        statuses: dict[str, int] = {}
        for c in self.jobs:
            statuses[c.status] = statuses.get(c.status, 0) + 1
        counted = ", ".join(f"{n} {status}" for status, n in statuses.items())
        jobs = f"{len(self.jobs)} job{'' if len(self.jobs) == 1 else 's'}"
        lines = [f"{setting}; {switches}.", f"Seed {self.params.seed}, {jobs}: {counted}."]

        grouped: dict[str, list[Breach]] = {}  # the same breach of several jobs is said once
        for breach in self.breaches():
            grouped.setdefault(breach.what, []).append(breach)
        said = [f"{', '.join(b.job for b in group)} {'was' if len(group) == 1 else 'were'} {what}"
                for what, group in grouped.items()]
        lines.append(f"The guarantee broke: {'; '.join(said)}." if said else "The guarantee held.")

        fixes = self.fixed_by()
        # This stage's own failure first, then the others in the order the stages fix them.
        for fixer, signs in sorted(fixes.items(), key=lambda item: (item[0] != own, order.index(item[0]))):
            shown, one = " and ".join(signs), len(signs) == 1
            if fixer == own:
                lines.append(f"This stage's failure: {shown}, which {own} fixes.")
            elif own is None or order.index(fixer) > order.index(own):
                lines.append(f"Expected at this stage: {shown} {'remains' if one else 'remain'} until {fixer} "
                             f"(stage {stage_number(fixer):02d}) {MECHANISM_FIXES[fixer]}.")
            else:  # only with switches picked by hand: an earlier stage's mechanism was off too
                lines.append(f"Not this stage's failure: {shown} {'comes' if one else 'come'} from {fixer} "
                             f"(stage {stage_number(fixer):02d}) being off in this run.")
        for check in self.stage_checks:
            said = "; ".join(", ".join(f"{k} {v}" for k, v in row.items()) for row in check.violations)
            lines.append(f"This stage's invariant held: {check.name}." if check.held else
                         f"This stage's invariant broke: {check.name} ({said}).")
        if own is not None and not own_on and own not in fixes and not self.stage_checks:
            # Backoff's and the semaphore's failures are load, which the guarantee does not cover.
            lines.append(f"With {own} off, this stage's failure is not a broken guarantee: see the measurements.")
        return lines

    def table(self) -> list[str]:
        """The rows as aligned text, a header first: labels and statuses left, counts right."""
        cells = [list(ROW_COLUMNS), *([str(value) for value in row.values()] for row in self.rows())]
        widths = [max(len(line[i]) for line in cells) for i in range(len(ROW_COLUMNS))]
        return ["  ".join(cell.ljust(width) if i < 2 else cell.rjust(width)
                          for i, (cell, width) in enumerate(zip(line, widths, strict=True))).rstrip()
                for line in cells]

    def measured(self) -> list[str]:
        """The stage's scalar measurements, one a line. Lists and dicts are left to the notebooks'
        charts: some vary run to run (who claimed what, retry delays), which saved outputs cannot mask."""
        scalars = [f"  {k}={v}" for k, v in self.measurements.items() if isinstance(v, int | float | str | bool | None)]
        return ["Measured:", *scalars] if scalars else []

    def summary(self) -> str:
        """The verdict and the measurements, in lines that fit a notebook's output area; no table (the
        notebooks show it as a DataFrame beside this)."""
        return "\n".join(wrap([*self.verdict(), *self.measured()]))

    def report(self) -> str:
        """The verdict, the table of A/H/C/F per job, then the measurements: one run, as the CLI prints it."""
        measured = self.measured()
        return "\n".join(wrap([*self.verdict(), "", *self.table(), *([""] if measured else []), *measured]))


def stage_mechanisms(mechanism: str | None, on: bool) -> Mechanisms:
    """Every mechanism before `mechanism` on, `mechanism` itself as `on` says, later ones off.
    None (the naive stage): everything off either way."""
    if mechanism is None:
        return Mechanisms.all_off()
    names = Mechanisms.names()
    position = names.index(mechanism)
    return Mechanisms.up_to(names[position - 1] if position else None).with_flags(**{mechanism: on})


def run_name(mechanism: str | None, mechanisms: Mechanisms) -> str:
    """How a run of the stage adding `mechanism` is named: as the stage names its own runs ("semaphore on",
    "naive") when `mechanisms` are the stage's, whoever picked them (a panel's are, by default); else by the
    switches that are off. Listed so, the stage's own would name the mechanisms of the stages still to come."""
    own_on = mechanism is not None and getattr(mechanisms, mechanism)
    if mechanisms != stage_mechanisms(mechanism, own_on):
        return mechanisms.describe()
    return "naive" if mechanism is None else f"{mechanism} {'on' if own_on else 'off'}"


def stage_number(mechanism: str | None) -> int:
    """The stage that adds `mechanism`: 1 is naive (None), then one stage per mechanism, in order."""
    return 1 if mechanism is None else Mechanisms.names().index(mechanism) + 2


def wrap(lines: Sequence[str]) -> list[str]:
    """`lines` broken at spaces to LINE_WIDTH, continuations indented; blank lines kept."""
    return [part for line in lines
            for part in textwrap.wrap(line, LINE_WIDTH, subsequent_indent="    ", break_long_words=False,
                                      break_on_hyphens=False) or [""]]


