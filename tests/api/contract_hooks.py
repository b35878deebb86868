"""Schemathesis hooks for tests/api/test_contract.py (loaded by name: SCHEMATHESIS_HOOKS), saying the
rules of the API's document that OpenAPI cannot, each across two values: a single job's `Idempotency-Key`
header and its body's `submission_key` are one key (different keys: 422, "send one key"), and a batch's
jobs have keys of their own (a repeat: 422, "a key names one job"). A valid request generated against
them is made to keep them, the way a client does: the header's key in the body too, a repeat dropped."""

from __future__ import annotations

import schemathesis


def one_key(case: schemathesis.Case) -> schemathesis.Case:
    """`case`, when valid, with one key per job: its header's in its body too, a batch's repeats dropped."""
    if (case.meta is not None and not case.meta.generation.mode.is_positive) or not isinstance(case.body, dict):
        return case
    header = (case.headers or {}).get("Idempotency-Key")
    if header is not None and "submission_key" in case.body:
        case.body = {**case.body, "submission_key": header}
    if isinstance(case.body.get("jobs"), list):
        seen: set[object] = set()
        jobs = []
        for job in case.body["jobs"]:
            if isinstance(job, dict) and "submission_key" in job:
                if job["submission_key"] in seen:
                    job = {name: value for name, value in job.items() if name != "submission_key"}
                seen.add(job.get("submission_key"))
            jobs.append(job)
        case.body = {**case.body, "jobs": jobs}
    return case


@schemathesis.hook
def map_case(context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    return one_key(case)
