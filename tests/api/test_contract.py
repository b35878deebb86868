"""The API against its own OpenAPI document, read as a client generator reads it: schemathesis generates
requests from `/openapi.json` (bodies, parameters, methods and headers the document does not list) and
sends them to the live API on loopback over a real PostgreSQL, every one of its checks on: no 5xx; a
status, body and headers the document allows; a request the document calls valid accepted, and one it
calls invalid refused; a method the document does not list at a path answered 405 with the `Allow` it
gives. A refused request stores nothing. The answers made-up ids and bodies never reach (a real job, a
DEAD one, a missing token) are checked against it one by one. The one rule OpenAPI cannot say (a single
job's header key and body key are one key) is said in tests/api/contract_hooks.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from reliableq.api import HEALTH_PATHS, create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from reliableq.servers import LoopbackServer
from tests.api.contract_hooks import one_key
from tests.api.job_steps import make_dead
from tests.conftest import serve

EXAMPLES_PER_OPERATION = 25  # bounded: the fuzzing takes about 15 s, the run of every phase about 10 s
SEED = 1  # the command-line run's: its cases are the same on every run


@pytest.fixture
def api_url(databases):
    with LoopbackServer(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as server:
        yield server.url


@pytest.fixture
def jobs_stored(databases):
    """How many jobs the test's queue database holds now, read on a new connection."""
    def count() -> int:
        with psycopg.connect(databases.queue_url, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
    return count


@pytest.mark.slow
def test_api_answers_as_its_document_says(api_url, jobs_stored):
    """Fixed examples (derandomized) of every operation, fitting the document (positive) or not
    (negative), each answer put to every check: a positive example refused or a negative one accepted
    fails too; a request answered 4xx leaves the jobs table as it was."""
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, "the document lists no operation"
    # A text path parameter, or nothing at all, has no wrong value to send.
    breakable = [operation for operation in operations if operation.body
                 or any(parameter.location == "query" for parameter in operation.iter_parameters())]
    runs = [(GenerationMode.POSITIVE, operation) for operation in operations]
    runs += [(GenerationMode.NEGATIVE, operation) for operation in breakable]

    for mode, operation in runs:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, derandomize=True, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def answers_as_documented(case):
            case = one_key(case)
            before = jobs_stored()
            response = case.call()
            case.validate_response(response)  # no `checks`: all of them
            if response.status_code >= 400:
                assert jobs_stored() == before, f"{case.method} {case.path} answered {response.status_code} but stored"
        answers_as_documented()


def test_fastapis_own_refusals_have_the_apis_error_body_and_the_documents_methods(api_url):
    """No such route (404), a query parameter not of its type (422) and a method no route serves at a
    path (405, its Allow naming exactly the methods the document lists there) answer {"error": "..."}."""
    refusals = [("GET", "/v2/nothing", 404, None), ("GET", "/v1/jobs?limit=many", 422, None),
                ("POST", f"/v1/jobs/{uuid.uuid4()}/replay?budget=x", 422, None)]
    paths = httpx.get(f"{api_url}/openapi.json").json()["paths"]
    for path, operations in paths.items():
        concrete = re.sub(r"\{\w+\}", str(uuid.uuid4()), path)
        # As OpenAPI matches paths, a spelled-out path (/v1/jobs/batch) is not also a template's
        # (/v1/jobs/{job_id}): GET there is refused, not read as a job id.
        declared = {method.upper() for method in operations}
        undeclared = sorted({"GET", "POST", "PUT", "DELETE"} - declared)
        refusals += [(method, concrete, 405, declared) for method in undeclared]
    for method, path, status, allowed in refusals:
        response = httpx.request(method, f"{api_url}{path}")
        assert response.status_code == status, (method, path, response.text)
        assert set(response.json()) == {"error"} and response.json()["error"], (method, path)
        if allowed is not None:
            assert set(response.headers["Allow"].split(", ")) == allowed, (method, path)


def test_only_endpoints_that_take_just_the_request_skip_fastapis_middleware_and_routing(databases):
    """The submissions, the readiness probes and the metrics are called with the Request before FastAPI's
    middleware stack (their errors still reach the app's handlers: the refusal and outage tests send
    them); every route with a parameter of its own keeps FastAPI's, which validates it (the 422s above).
    A middleware that records what passes it sees only the latter."""
    app = create_api_app(databases.queue_url, kinds=STANDARD_KINDS, api_token="t0ken")
    assert set(app.direct_endpoints) == {
        ("POST", "/v1/jobs"), ("POST", "/v1/jobs/batch"), ("GET", "/health/ready"), ("GET", "/healthz"),
        ("GET", "/metrics")}
    passed: list[str] = []

    @app.middleware("http")
    async def record(request, call_next):
        passed.append(f"{request.method} {request.url.path}")
        return await call_next(request)
    token = {"Authorization": "Bearer t0ken"}
    with LoopbackServer(app) as server:
        job = httpx.post(f"{server.url}/v1/jobs", json={"amount_cents": 5}, headers=token)
        assert job.status_code == 202, job.text
        assert httpx.post(f"{server.url}/v1/jobs", content=b"{", headers=token).status_code == 400
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        assert httpx.get(f"{server.url}/metrics", headers=token).status_code == 200
        assert httpx.post(f"{server.url}/v1/jobs", json={"amount_cents": 5}).status_code == 401
        assert httpx.get(f"{server.url}/v1/jobs/{job.json()['id']}", headers=token).status_code == 200
        assert httpx.get(f"{server.url}/v1/jobs/{job.json()['id']}").status_code == 401
    assert passed == [f"GET /v1/jobs/{job.json()['id']}"]


@pytest.mark.slow
def test_schemathesis_run_with_every_check_finds_nothing(api_url, tmp_path):
    """`st run` as a user would start it, every phase (examples, coverage: each parameter's edges and each
    undeclared method, fuzzing, stateful) and every check, with a fixed seed: no failure."""
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{api_url}/openapi.json", "--checks", "all",
         "--seed", str(SEED), "--max-examples", str(EXAMPLES_PER_OPERATION), "--workers", "1",
         "--no-color", "--output-truncate", "false"],
        # In a folder of its own: the run leaves its cache (.schemathesis/) where it runs.
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env=os.environ | {"SCHEMATHESIS_HOOKS": "tests.api.contract_hooks",
                          "PYTHONPATH": str(Path(__file__).parents[2])})
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-2000:]


async def test_answers_made_up_ids_never_reach_are_as_documented(databases, make_queue):
    """A stored job's details (200), replaying a job that is not DEAD (409) and one that is (200), and every
    route but the health probes without the bearer token (401): each a status the document lists, in its schema."""
    async with serve(create_api_app(databases.queue_url, api_token="s3cret", kinds=STANDARD_KINDS)) as client:
        signed = {"Authorization": "Bearer s3cret"}
        document = (await client.get("/openapi.json", headers=signed)).json()
        job_id = (await client.post("/v1/jobs", json={"amount_cents": 1250}, headers=signed)).json()["id"]
        answers = [(await client.get(f"/v1/jobs/{job_id}", headers=signed), "/v1/jobs/{job_id}", 200),
                   (await client.post(f"/v1/jobs/{job_id}/replay", headers=signed), "/v1/jobs/{job_id}/replay", 409)]
        await make_dead(make_queue, job_id)
        replayed = await client.post(f"/v1/jobs/{job_id}/replay", headers=signed)
        answers.append((replayed, "/v1/jobs/{job_id}/replay", 200))
        for path, operations in document["paths"].items():
            for method in operations:
                response = await client.request(method, re.sub(r"\{\w+\}", job_id, path), json={"amount_cents": 1})
                answers.append((response, path, 200 if path in HEALTH_PATHS else 401))
    schema = schemathesis.openapi.from_dict(document)
    for response, path, status in answers:
        method = response.request.method
        assert response.status_code == status, (method, path, response.text)
        assert str(status) in document["paths"][path][method.lower()]["responses"], (method, path)
        schema[path][method].validate_response(response)
