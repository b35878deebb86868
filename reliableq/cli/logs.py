"""How the `reliableq` processes log: the level each command starts at, text or JSON lines on stderr, and
the driver's reconnect noise summarised.

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
from datetime import UTC, datetime

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
LONG_RUNNING_COMMANDS = ("api", "worker", "charge-service")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The structured fields a record may carry (`extra=`); the JSON line includes those present.
FIELDS = ("worker_id", "job_id")
# Libraries that log at INFO per request or per connection checkout: a line per job, not lifecycle.
CHATTY_LIBRARIES = ("psycopg", "httpx", "httpcore")


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


class ConnectionErrorSummary(logging.Filter):
    """psycopg_pool logs a WARNING per failed connection attempt, so a database outage becomes a line per
    attempt per pool slot. Let the first one through, drop the rest for `window_seconds`, and say how many
    were dropped on the first one after the window. Boundary: the count of the last window of an outage
    is told only if another connection error follows it."""

    def __init__(self, window_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_seconds = window_seconds
        self.clock = clock
        self.window_started: float | None = None
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not (record.name == "psycopg.pool" and str(record.msg).startswith("error connecting")):
            return True
        now = self.clock()
        if self.window_started is not None and now - self.window_started < self.window_seconds:
            self.dropped += 1
            return False
        if self.dropped:
            record.msg = f"{record.getMessage()} ({self.dropped} more connection errors in the last " \
                         f"{self.window_seconds:g} s)"
            record.args = ()
        self.window_started, self.dropped = now, 0
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
    handler.addFilter(ConnectionErrorSummary())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if level > logging.DEBUG:
        for name in CHATTY_LIBRARIES:
            logging.getLogger(name).setLevel(max(level, logging.WARNING))
    return handler
