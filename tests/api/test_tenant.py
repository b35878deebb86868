"""Whose work a job is: the `tenant` of a submission, over real HTTP into real PostgreSQL. Stored with the
job (single, batch, keyed, through the group commit), shown by GET, `default` when left out, documented
in /openapi.json; a bad one is refused with a 422 that names it, and nothing is stored."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest

from reliableq.payload import DEFAULT_TENANT, MAX_TENANT_CHARS, TENANT_PATTERN


async def _tenants(queue_url: str) -> dict[str, str]:
    async with await psycopg.AsyncConnection.connect(queue_url) as conn:
        return {str(job_id): tenant for job_id, tenant in await (await conn.execute("SELECT id, tenant FROM jobs"))
                .fetchall()}


async def test_a_submissions_tenant_is_stored_and_shown_and_left_out_it_is_the_default(api, databases):
    named = await api.post("/v1/jobs", json={"amount_cents": 100, "tenant": "acme-corp"})
    plain = await api.post("/v1/jobs", json={"amount_cents": 200})
    assert named.status_code == plain.status_code == 202, named.text
    assert await _tenants(databases.queue_url) == {named.json()["id"]: "acme-corp",
                                                    plain.json()["id"]: DEFAULT_TENANT}
    shown = await api.get(f"/v1/jobs/{named.json()['id']}")
    assert shown.json()["tenant"] == "acme-corp" and "tenant" not in shown.json()["payload"]


async def test_a_batch_stores_each_jobs_own_tenant(api, databases):
    response = await api.post("/v1/jobs/batch", json={"jobs": [
        {"amount_cents": 1, "tenant": "a"}, {"amount_cents": 2},
        {"amount_cents": 3, "tenant": "b", "submission_key": "k3"}]})
    assert response.status_code == 202, response.text
    ids = [job["id"] for job in response.json()["jobs"]]
    assert await _tenants(databases.queue_url) == dict(zip(ids, ["a", DEFAULT_TENANT, "b"], strict=True))


@pytest.mark.parametrize("tenant", ["", " acme", "acme corp", "-leading-dash", "x" * (MAX_TENANT_CHARS + 1),
                                    "ünïcode", 42, None, ["a"]])
async def test_a_bad_tenant_is_refused_with_a_422_naming_it_and_nothing_is_stored(api, databases, tenant):
    single = await api.post("/v1/jobs", json={"amount_cents": 100, "tenant": tenant})
    batch = await api.post("/v1/jobs/batch",
                           json={"jobs": [{"amount_cents": 1}, {"amount_cents": 2, "tenant": tenant}]})
    assert single.status_code == batch.status_code == 422
    assert single.json()["error"].startswith("tenant must be 1 to 64 letters")
    assert batch.json()["error"].startswith("jobs[1]: tenant must be")
    assert await _tenants(databases.queue_url) == {}


async def test_a_keyed_repeat_for_another_tenant_is_another_request(api):
    """The tenant is part of what a key names: the same key and body for another tenant is refused (409),
    for the same tenant replayed."""
    key = {"Idempotency-Key": "order-7"}
    first = await api.post("/v1/jobs", headers=key, json={"amount_cents": 7, "tenant": "a"})
    again = await api.post("/v1/jobs", headers=key, json={"amount_cents": 7, "tenant": "a"})
    other = await api.post("/v1/jobs", headers=key, json={"amount_cents": 7, "tenant": "b"})
    assert (first.status_code, again.status_code, other.status_code) == (202, 202, 409)
    assert again.json()["replayed"] is True and again.json()["id"] == first.json()["id"]


async def test_the_document_shows_the_tenant_beside_the_envelopes_other_fields(api):
    schema = (await api.get("/openapi.json")).json()["components"]["schemas"]["ChargeSubmission"]
    assert schema["properties"]["tenant"] | {"description": ""} == {
        "type": "string", "pattern": TENANT_PATTERN, "default": DEFAULT_TENANT, "description": ""}
    job = (await api.get("/openapi.json")).json()["components"]["schemas"]["Job"]
    assert job["properties"]["tenant"]["type"] == "string" and "tenant" in job["required"]


def test_the_cli_submits_for_a_tenant_and_refuses_a_bad_one(databases):
    env = {"DATABASE_URL": databases.queue_url, "CHARGE_DATABASE_URL": databases.charge_url}
    run = [sys.executable, "-m", "reliableq", "submit", "--amount", "100"]
    done = subprocess.run([*run, "--tenant", "acme"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    with psycopg.connect(databases.queue_url) as conn:
        assert conn.execute("SELECT tenant FROM jobs WHERE id = %s", [done.stdout.strip()]).fetchone() == ("acme",)
    listed = subprocess.run([sys.executable, "-m", "reliableq", "jobs"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **env})
    assert f"{done.stdout.strip()}  PENDING    attempts=0/5  charge 1.00 USD  tenant=acme" in listed.stdout
    refused = subprocess.run([*run, "--tenant", "no spaces"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, **env})
    assert refused.returncode != 0 and "tenant must be" in refused.stderr and "Traceback" not in refused.stderr
