"""The README's job-kind example, run as written: its kind is accepted by the API it builds, its check
refuses a bad payload, and its worker runs the job (a README whose example broke would teach nothing)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from reliableq.charge.client import ChargeClient
from reliableq.lab.harness import fast_settings, local_system
from reliableq.queue import Queue
from tests.conftest import serve

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_python_block(section: str) -> str:
    """The first ```python block under the README heading `section`."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    return re.search(r"```python\n(.*?)```", text[start:], re.DOTALL).group(1)


async def test_the_readme_job_kind_example_runs(databases):
    """Every name the example leaves to the reader (charge_client, queue, settings, database_url) is
    given a real one; what the example builds accepts, refuses and runs as the README says."""
    async with local_system(databases=databases) as system:
        charge_client = ChargeClient(system.charge_url, 2.0)
        names = {"charge_client": charge_client, "queue": Queue(system.worker_pool, system.mechanisms),
                 "settings": fast_settings(), "database_url": databases.queue_url}
        exec(compile(readme_python_block("Job kinds: registering a handler"), "README.md", "exec"), names)
        async with serve(names["app"]) as api:
            accepted = await api.post("/v1/jobs", json={"kind": "email", "to": "ada@example.com", "max_attempts": 3})
            refused = await api.post("/v1/jobs", json={"kind": "email", "to": 7})
            misspelt = await api.post("/v1/jobs", json={"kind": "emial", "to": "ada@example.com"})
        assert accepted.status_code == 202, accepted.text
        assert (refused.status_code, refused.json()["error"]) == (422, "to must be an address")
        assert (misspelt.status_code, misspelt.json()["error"]) == (
            422, "kind: unknown job kind 'emial'; known: charge, email, noop")
        system.start_worker(names["worker"])
        job = await system.wait_for_status(uuid.UUID(accepted.json()["id"]), {"SUCCEEDED", "DEAD"}, timeout=10)
        await system.stop_workers()
        await charge_client.aclose()
    assert (job.kind, job.status, job.max_attempts, job.payload) == ("email", "SUCCEEDED", 3, {"to": "ada@example.com"})
