"""The SQL loader (reliableq/sql.py): every named block found, none empty; the lab's queries apart."""

from __future__ import annotations

from reliableq import sql


def test_every_named_query_is_loaded_and_nonempty():
    """The loader finds each `-- name:` block; the core's queries exist."""
    queue, charge = sql.queries("queue"), sql.queries("charge")
    for name in ("job_insert", "job_claim_due_skip_locked", "job_select_due", "job_mark_claimed",
                 "job_renew_lease", "job_succeed", "job_retry", "job_dead", "job_replay"):
        assert queue[name].strip()
    assert "ON CONFLICT (idempotency_key) DO NOTHING" in charge["charge_insert_once"]
    assert all(not text.lstrip().startswith("--") for text in {**queue, **charge}.values())


def test_the_labs_queries_are_apart_from_the_cores():
    """lab_queue.sql and lab_charge.sql load through the same loader and share no name with the core's."""
    for database in ("queue", "charge"):
        core, lab = sql.queries(database), sql.queries(f"lab_{database}")
        assert lab and not set(core) & set(lab)
        assert all(text.strip() and not text.lstrip().startswith("--") for text in lab.values())
