"""A stage run's log lines name jobs job-1, job-2 as its tables do, even a line logged before the run
learned the id it names (the API's crash, logged right after its 202 went out). Made-up ids and records
here (no database); the stage tests check the same on real runs."""

from __future__ import annotations

import logging
import uuid

from reliableq.lab.experiment import _JobLabels

LOGGER = "reliableq.api"


def test_a_line_naming_an_id_not_yet_submitted_waits_and_then_names_it_by_its_label(caplog):
    """The API logs a crash on the first job before the client has its id: the line is not shown with
    the UUID, and once the run learns the id it is shown saying job-1."""
    submitted: list[uuid.UUID] = []
    labels = _JobLabels(submitted)
    logger = logging.getLogger(LOGGER)
    logger.addFilter(labels)
    try:
        first = uuid.uuid4()
        logger.warning("simulated API crash after acknowledging job %s: the job is lost", first)
        assert caplog.messages == []
        submitted.append(first)
        labels.log_held()
        assert caplog.messages == ["simulated API crash after acknowledging job-1: the job is lost"]
    finally:
        logger.removeFilter(labels)


def test_a_line_naming_an_id_the_run_never_learns_is_shown_as_it_was_when_the_run_ends(caplog):
    """Held lines are not lost: after the run (its filter removed), they are logged unchanged."""
    submitted = [uuid.uuid4()]
    labels = _JobLabels(submitted)
    logger = logging.getLogger(LOGGER)
    logger.addFilter(labels)
    stranger = uuid.uuid4()
    try:
        logger.warning("job %s and job %s", submitted[0], stranger)
        labels.log_held()  # nothing learned since: still held
        assert caplog.messages == []
    finally:
        logger.removeFilter(labels)
    labels.log_held()
    assert caplog.messages == [f"job {submitted[0]} and job {stranger}"]
