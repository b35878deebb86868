"""Real `reliableq` processes on loopback: started with the CLI over given databases, waited for, stopped.

The kill9 and pause demos and the benchmark need release-like processes and real signals (SIGKILL,
SIGSTOP, SIGTERM), so they share these helpers. Servers bind 127.0.0.1 on a free port and count as
started once `/healthz` answers. What this module does not do: decide what a process runs, or clean
up after a caller that forgets to stop what it started (use `stop` or `kill` in a `finally`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from reliableq.db import Databases

READY_TIMEOUT_SECONDS = 30.0


@dataclass
class CliProcess:
    """One `python -m reliableq ...` process; its output goes to `log_path`, or to a pipe without one."""

    name: str
    process: subprocess.Popen
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

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


def spawn_cli(databases: Databases, name: str, *args: str, log_path: Path | None = None) -> CliProcess:
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
    return CliProcess(name, process, log_path)


def spawn_worker(databases: Databases, charge_url: str, worker_id: str, lease_seconds: float, *extra: str,
                 poll_seconds: float = 0.05, log_path: Path | None = None) -> CliProcess:
    """A real `reliableq worker` process over `databases` and the charge service at `charge_url`."""
    return spawn_cli(databases, worker_id, "worker", "--charge-url", charge_url, "--worker-id", worker_id,
                     "--lease", str(lease_seconds), "--poll", str(poll_seconds), "--grace", "2", *extra,
                     log_path=log_path)


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def spawn_server(databases: Databases, command: str, *extra: str, log_path: Path | None = None,
                       timeout: float = READY_TIMEOUT_SECONDS) -> tuple[CliProcess, str]:
    """Start `reliableq api` or `reliableq charge-service` on a free loopback port; return it and its URL
    once `/healthz` answers 200."""
    port = free_port()
    server = spawn_cli(databases, command, command, "--host", "127.0.0.1", "--port", str(port), *extra,
                       log_path=log_path)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            if server.process.poll() is not None:
                raise RuntimeError(f"{command} exited with {server.process.returncode}: {server.output()[-500:]}")
            try:
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return server, url
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                server.kill()
                raise TimeoutError(f"{command} did not answer /healthz within {timeout}s")
            await asyncio.sleep(0.05)


async def wait_output(process: CliProcess, text: str, timeout: float) -> None:
    """Wait until the process printed `text` (e.g. a worker's "running" line)."""
    deadline = time.monotonic() + timeout
    while text not in process.output():
        if process.process.poll() is not None:
            raise RuntimeError(f"{process.name} exited with {process.process.returncode} before printing {text!r}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.name} did not print {text!r} within {timeout}s")
        await asyncio.sleep(0.02)


async def wait_exit(process: CliProcess, timeout: float) -> int:
    """The exit code (negative: the signal that ended it); SIGKILLs it and raises after `timeout`."""
    deadline = time.monotonic() + timeout
    while process.process.poll() is None:
        if time.monotonic() > deadline:
            process.process.kill()
            raise TimeoutError(f"{process.name} (pid {process.pid}) did not exit within {timeout}s")
        await asyncio.sleep(0.02)
    return process.process.returncode


async def stop(process: CliProcess, timeout: float = 15) -> str:
    """SIGTERM (a graceful stop), wait for the exit, and return the last line it printed."""
    if process.process.poll() is None:
        process.send_signal(signal.SIGTERM)
    await wait_exit(process, timeout)
    return process.last_line()
