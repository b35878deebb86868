"""Real `reliableq` processes on loopback: started with the CLI over given databases, waited for, stopped.

The kill9 and pause demos and the benchmark need release-like processes and real signals (SIGKILL,
SIGSTOP, SIGTERM), so they share these helpers. Servers bind 127.0.0.1 on a free port and count as
started once `/healthz` answers. What this module does not do: decide what a process runs, or clean
up after a caller that forgets to stop what it started (use `stop` or `kill` in a `finally`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from reliableq.db import Databases
from reliableq.lab.waiting import wait_until
from reliableq.servers import free_port

READY_TIMEOUT_SECONDS = 30.0


@dataclass
class CliProcess:
    """One `python -m reliableq ...` process; its output goes to `log_path`, or to a pipe without one."""

    name: str
    process: subprocess.Popen
    log_path: Path | None = None
    status_path: Path | None = None  # a worker's status file (`reliableq worker --status-file`)

    @property
    def pid(self) -> int:
        return self.process.pid

    def status(self) -> dict | None:
        """A worker's status file: {"state": "running"}, then {"state": "stopped", "stats": ...}; None
        before it wrote one."""
        if self.status_path is None or not self.status_path.exists():
            return None
        return json.loads(self.status_path.read_text())

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def output(self) -> str:
        """Everything the process printed so far (a pipe is read only once it has exited)."""
        if self.log_path is not None:
            return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        if self.process.stdout and self.process.poll() is not None:
            return self.process.stdout.read()
        return ""

    def last_line(self) -> str:
        lines = self.output().strip().splitlines()
        return lines[-1] if lines else ""

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


def cli_env(databases: Databases) -> dict[str, str]:
    return os.environ | {"DATABASE_URL": databases.queue_url, "CHARGE_DATABASE_URL": databases.charge_url}


def spawn_cli(databases: Databases, name: str, *args: str, log_path: Path | None = None,
              status_path: Path | None = None) -> CliProcess:
    """Start `python -m reliableq <args>` over `databases`."""
    command = [sys.executable, "-m", "reliableq", *args]
    if log_path is None:
        process = subprocess.Popen(command, env=cli_env(databases), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    else:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # A file, not a pipe: a long run's output can never fill a pipe buffer and block the process.
        with open(log_path, "wb") as log:
            process = subprocess.Popen(command, env=cli_env(databases), stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
    return CliProcess(name, process, log_path, status_path)


def spawn_worker(databases: Databases, charge_url: str, worker_id: str, lease_seconds: float, *extra: str,
                 poll_seconds: float = 0.05, log_path: Path | None = None) -> CliProcess:
    """A real `reliableq worker` process over `databases` and the charge service at `charge_url`; its
    status file beside its log (or in a fresh temporary folder)."""
    folder = log_path.parent if log_path else Path(tempfile.mkdtemp(prefix="reliableq-worker-"))
    status_path = folder / f"{worker_id}.status.json"
    return spawn_cli(databases, worker_id, "worker", "--charge-url", charge_url, "--worker-id", worker_id,
                     "--lease", str(lease_seconds), "--poll", str(poll_seconds), "--grace", "2",
                     "--status-file", str(status_path), *extra, log_path=log_path, status_path=status_path)


async def wait_running(worker: CliProcess, timeout: float) -> None:
    """Wait until a worker process says, in its status file, that it is running."""
    def running() -> bool:
        if worker.process.poll() is not None:
            raise RuntimeError(f"{worker.name} exited with {worker.process.returncode} before it ran: "
                               f"{worker.last_line() or 'nothing printed'}")
        status = worker.status()
        return status is not None and status["state"] == "running"
    await wait_until(running, timeout, f"{worker.name} to run")


async def spawn_server(databases: Databases, command: str, *extra: str, log_path: Path | None = None,
                       timeout: float = READY_TIMEOUT_SECONDS, port: int | None = None) -> tuple[CliProcess, str]:
    """Start `reliableq api` or `reliableq charge-service` on `port` (default: a free loopback port; a
    restarted server takes its predecessor's); return it and its URL once `/healthz` answers 200."""
    port = port or free_port()
    server = spawn_cli(databases, command, command, "--host", "127.0.0.1", "--port", str(port), *extra,
                       log_path=log_path)
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=2) as http:
        async def healthy() -> bool:
            if server.process.poll() is not None:
                raise RuntimeError(f"{command} exited with {server.process.returncode}: {server.output()[-500:]}")
            try:
                return (await http.get(f"{url}/healthz")).status_code == 200
            except httpx.TransportError:
                return False  # not listening yet
        try:
            await wait_until(healthy, timeout, f"{command} to answer /healthz", interval=0.05)
        except BaseException:  # a timeout, and a caller's cancellation too: never leave it running
            server.kill()
            raise
    return server, url


async def wait_exit(process: CliProcess, timeout: float) -> int:
    """The exit code (negative: the signal that ended it); SIGKILLs it and raises after `timeout`."""
    try:
        await wait_until(lambda: process.process.poll() is not None, timeout,
                         f"{process.name} (pid {process.pid}) to exit")
    except TimeoutError:
        process.process.kill()
        raise
    return process.process.returncode


async def stop(process: CliProcess, timeout: float = 15) -> str:
    """SIGTERM (a graceful stop), wait for the exit, and return the last line it printed."""
    if process.process.poll() is None:
        process.send_signal(signal.SIGTERM)
    await wait_exit(process, timeout)
    return process.last_line()
