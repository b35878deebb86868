"""JupyterLab for the browser tests: `reliableq lab` (what a learner runs) over a workspace in a scratch folder,
on a free loopback port, with a token, and with JupyterLab's own state kept in the scratch folder too.

`reliableq lab` copies the clone's notebooks into the workspace and serves the copies, as for a learner:
running a notebook in a browser autosaves it, and the repository's notebooks never change. JupyterLab's
settings, workspaces, runtime files and the notebook signatures `reliableq lab` writes go to the scratch
folder too, so a test run neither reads nor alters the user's own JupyterLab. What this module does not
do: drive the browser (notebook_page.py does).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from reliableq.lab.places import WORKSPACE_VARIABLE
from reliableq.lab.processes import CliProcess, stop
from reliableq.lab.waiting import wait_until
from reliableq.servers import free_port

# The first start of the embedded PostgreSQL and the schema migration come before JupyterLab listens.
READY_TIMEOUT_SECONDS = 90.0

# A fresh JupyterLab asks, in a pop-up over the notebook, whether to fetch Jupyter's news: it would cover
# what the tests look at, and this machine's network is closed anyway.
_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings":
             {"fetchNews": "false", "checkForUpdates": False}}


@dataclass
class LabServer:
    """A running JupyterLab: its address, token, the workspace it serves, and its process."""

    url: str
    token: str
    workspace: Path
    process: CliProcess

    def notebook_url(self, path: str, workspace: str) -> str:
        """The address that opens `path` alone, in a workspace of its own: a test never finds the notebooks
        an earlier test left open (JupyterLab restores a workspace's tabs)."""
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?token={self.token}"

    def shut_down_kernels(self) -> None:
        """End every notebook session and its kernel, so the next test starts from a quiet server."""
        headers = {"Authorization": f"token {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as http:
            for session in http.get("/api/sessions").raise_for_status().json():
                http.delete(f"/api/sessions/{session['id']}").raise_for_status()


def start_lab(scratch: Path) -> LabServer:
    """`reliableq lab` with a fresh workspace in `scratch` (each test run starts from the starters); return
    once the server answers. Its output goes to `scratch/jupyterlab.log`. DATABASE_URL, when set, reaches it
    and its kernels unchanged."""
    workspace = scratch / "workspace"
    jupyter = scratch / "jupyter"
    for name, settings in _SETTINGS.items():
        path = jupyter / "settings" / name
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(settings))
    env = os.environ | {
        "JUPYTER_CONFIG_DIR": str(jupyter / "config"),
        "JUPYTER_DATA_DIR": str(jupyter / "data"),  # where the notebook signatures go
        "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(jupyter / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(jupyter / "workspaces"),
        "IPYTHONDIR": str(jupyter / "ipython"),  # the kernels' input history
        WORKSPACE_VARIABLE: str(workspace),
    }
    port, token = free_port(), secrets.token_hex(16)
    log_path = scratch / "jupyterlab.log"
    command = [sys.executable, "-m", "reliableq", "lab", "--port", str(port), "--token", token, "--no-browser"]
    # A file, not a pipe: JupyterLab logs every request, and a full pipe would block it.
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    lab = LabServer(f"http://127.0.0.1:{port}", token, workspace, CliProcess("jupyterlab", process, log_path))
    try:
        asyncio.run(_wait_ready(lab))
    except BaseException:  # a timeout, and an interrupted test run too: never leave it running
        lab.process.kill()
        raise
    return lab


async def _wait_ready(lab: LabServer) -> None:
    async with httpx.AsyncClient(timeout=2) as http:
        async def answers() -> bool:
            if lab.process.process.poll() is not None:
                raise RuntimeError(f"reliableq lab exited with {lab.process.process.returncode}:\n"
                                   f"{lab.process.output()[-2000:]}")
            try:
                response = await http.get(f"{lab.url}/api/status", params={"token": lab.token})
            except httpx.TransportError:
                return False  # not listening yet
            return response.status_code == 200
        await wait_until(answers, READY_TIMEOUT_SECONDS, f"JupyterLab to answer on {lab.url}", interval=0.1)


def stop_lab(lab: LabServer) -> None:
    """SIGTERM: JupyterLab shuts its kernels down before it exits (SIGKILL after the deadline)."""
    asyncio.run(stop(lab.process, timeout=30))
