"""A client that retries every submission it never heard answered, against a real API process killed
mid-stream: the lost answer that turns a retry into a second job, and the idempotency key that turns
it back into the first one.

The API is a real `reliableq api` process on loopback. It is SIGKILLed right after a submission
commits and before its 202 leaves (`--crash-at after_commit_before_ack`: the client never hears of a
job that exists, every run), and, with `kill_after`, once more from outside in the middle of the
stream. After each death a new API process starts on the same port, as a supervisor would restart it.
The client sends each request until it hears an answer, retrying connection errors and 503s with the
same body (and, with keys, the same `Idempotency-Key`). Afterwards the queue's database says how many
jobs each request made: each is marked by its own payload description.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from reliableq import scratch
from reliableq.db import Databases
from reliableq.lab.ledger import read_rows
from reliableq.lab.processes import CliProcess, spawn_server, stop, wait_exit
from reliableq.lab.waiting import wait_until
from reliableq.servers import free_port

# A client's pause between tries of one request: long enough not to spin while the API restarts.
RETRY_PAUSE_SECONDS = 0.05


@dataclass
class ClientRequest:
    """One request the client means to make once, and what it heard."""

    description: str  # marks the jobs this request made
    body: dict
    key: str | None
    tries: int = 0
    answer: dict | None = None  # the 202's body, once heard

    @property
    def replayed(self) -> bool:
        return bool(self.answer and self.answer.get("replayed"))


@dataclass(frozen=True)
class LostAnswerRun:
    """What a run of the retrying client left behind."""

    with_keys: bool
    requests: list[ClientRequest]
    jobs_by_request: dict[str, list[uuid.UUID]]  # description -> the jobs it made
    keys_held: int
    api_kills: int
    problems: list[str] = field(default_factory=list)  # acknowledged ids the database does not hold as answered

    @property
    def acknowledged(self) -> int:
        return sum(request.answer is not None for request in self.requests)

    @property
    def jobs_stored(self) -> int:
        return sum(len(jobs) for jobs in self.jobs_by_request.values())

    @property
    def duplicated(self) -> list[str]:
        """Requests that made more than one job: each would be charged more than once."""
        return [request.description for request in self.requests
                if len(self.jobs_by_request.get(request.description, [])) > 1]

    def per_request(self) -> list[dict]:
        """One row per client request: whether it was retried, how many jobs it made, and what its 202 gave."""
        return [{"request": request.description, "retried": request.tries > 1,
                 "jobs stored": len(self.jobs_by_request.get(request.description, [])),
                 "answered with": "the job an earlier try made" if request.replayed else "a new job"}
                for request in self.requests]

    def summary(self) -> list[str]:
        """A few lines a learner reads: what was sent, heard and stored, and the verdict."""
        retried = sum(request.tries > 1 for request in self.requests)
        lines = [f"{'with' if self.with_keys else 'without'} an Idempotency-Key: {len(self.requests)} client "
                 f"requests ({retried} retried), {self.acknowledged} answered 202, {self.jobs_stored} jobs stored "
                 f"(the API was SIGKILLed {self.api_kills} time{'s' * (self.api_kills != 1)})"]
        if self.duplicated:
            lines.append(f"BROKEN: {len(self.duplicated)} request(s) became two jobs or more, each charged: "
                         + ", ".join(self.duplicated[:5]) + " (its first try committed, its 202 was lost, "
                         "and the retry looked new)")
        else:
            replayed = sum(request.replayed for request in self.requests)
            lines.append(f"HOLDS: one job per client request; {replayed} retr{'ies' if replayed != 1 else 'y'} "
                         "answered with the job an unanswered try had made")
        lines.extend(self.problems)
        return lines


def client_requests(count: int, seed: int, with_keys: bool) -> list[ClientRequest]:
    """`count` charge requests with seeded amounts and keys."""
    rng = random.Random(seed)
    requests = []
    for index in range(count):
        key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        requests.append(ClientRequest(f"request-{index + 1}", {"amount_cents": rng.randint(100, 99_999),
                                                               "description": f"request-{index + 1}"},
                                      key if with_keys else None))
    return requests


async def send_until_answered(http: httpx.AsyncClient, request: ClientRequest, deadline: float) -> None:
    """Send `request` until the API answers it: a connection that broke or a 503 is tried again, with the
    same body and key. An answer other than 202 is an error for the caller."""
    loop = asyncio.get_running_loop()
    while True:
        request.tries += 1
        try:
            response = await http.post("/v1/jobs", json=request.body,
                                       headers={"Idempotency-Key": request.key} if request.key else {})
        except httpx.TransportError:
            response = None  # the API died or is not back yet: whether the job was stored, nobody told us
        if response is not None and response.status_code != 503:
            if response.status_code != 202:
                raise RuntimeError(f"{request.description} answered {response.status_code}: {response.text[:200]}")
            request.answer = response.json()
            return
        if loop.time() > deadline:
            raise TimeoutError(f"{request.description} unanswered after {request.tries} tries")
        await asyncio.sleep(RETRY_PAUSE_SECONDS)


async def run_lost_answer(databases: Databases, *, with_keys: bool, requests: int = 10, concurrency: int = 1,
                          kill_after: int | None = None, seed: int = 0, timeout: float = 60.0) -> LostAnswerRun:
    """Send `requests` charges through real API processes, `concurrency` at a time, while the API is
    killed after its first commit (and from outside after `kill_after` answers); see the module."""
    sent = client_requests(requests, seed, with_keys)
    port = free_port()
    deadline = asyncio.get_running_loop().time() + timeout
    with tempfile.TemporaryDirectory(prefix="reliableq-lost-answer-") as logs:
        started: list[CliProcess] = []

        async def start(*extra: str) -> None:
            api, _ = await spawn_server(databases, "api", *extra, port=port,
                                        log_path=Path(logs) / f"api-{len(started) + 1}.log")
            started.append(api)

        async def restart_after_death() -> None:
            await wait_exit(started[-1], timeout)
            await start()

        await start("--crash-at", "after_commit_before_ack")
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
                permits = asyncio.Semaphore(concurrency)

                async def send(request: ClientRequest) -> None:
                    async with permits:
                        await send_until_answered(http, request, deadline)
                client = asyncio.gather(*(send(request) for request in sent))
                try:
                    await restart_after_death()  # the API kills itself after its first commit
                    if kill_after is not None:
                        await wait_until(lambda: sum(r.answer is not None for r in sent) >= kill_after, timeout,
                                         f"{kill_after} answers before the second kill")
                        started[-1].kill()  # SIGKILL from outside, mid-stream
                        await restart_after_death()
                    await client
                except BaseException:
                    client.cancel()
                    raise
        finally:
            for api in started[:-1]:
                api.kill()
            await stop(started[-1])
    rows = await read_rows(databases.queue_url, "lab_queue", "jobs_by_description")
    jobs_by_request = {row["description"]: row["job_ids"] for row in rows}
    (held,) = await read_rows(databases.queue_url, "lab_queue", "submission_keys_count")
    problems = [f"MISMATCH: {request.description} was answered with job {request.answer['id']}, which it did not make"
                for request in sent if request.answer
                and uuid.UUID(request.answer["id"]) not in jobs_by_request.get(request.description, [])]
    return LostAnswerRun(with_keys, sent, jobs_by_request, held["keys_held"], len(started) - 1, problems)


async def demonstrate(with_keys: bool, requests: int = 6, seed: int = 1) -> LostAnswerRun:
    """`run_lost_answer` on fresh databases, one request at a time: exactly one try commits unanswered
    (the first), so every run tells the same story (notebook 02)."""
    with scratch.scratch_databases("rq_lost_answer") as databases:
        return await run_lost_answer(databases, with_keys=with_keys, requests=requests, seed=seed)
