"""Loading a learner's code: a Python function or named SQL queries, from the text of their file.

A learner's broken code is bad input: whatever goes wrong (a syntax error, a missing function, an
exception while it runs, SQL PostgreSQL refuses) becomes a `LearnerError` whose message names the file
and the line, never a traceback. What this does not do: decide whether the code is right (the checker
runs it in the real system for that).
"""

from __future__ import annotations

import re
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psycopg

from reliableq import db, sql


class LearnerError(Exception):
    """The learner's code could not be used; the message says where and why, in one or two lines."""


def load_function(text: str, filename: str, name: str) -> Callable[..., Any]:
    """The function `name` defined by the Python `text` of the learner's `filename`; a call that raises
    raises LearnerError naming the learner's line."""
    try:
        code = compile(text, filename, "exec")
    except SyntaxError as error:
        raise LearnerError(f"{filename}, line {error.lineno}: {error.msg}") from None
    module = types.ModuleType(filename.removesuffix(".py"))
    module.__file__ = filename
    try:
        exec(code, module.__dict__)  # noqa: S102  (the learner's own code, run as they wrote it)
    except Exception as error:
        raise LearnerError(at_learner_line(error, filename)) from None
    function = module.__dict__.get(name)
    if not callable(function):
        raise LearnerError(f"{filename}: define a function named {name}")

    def guarded(*args: Any) -> Any:
        try:
            return within_deadline(function, args, filename)
        except LearnerError:
            raise
        except Exception as error:
            raise LearnerError(at_learner_line(error, filename)) from None
    return guarded


CALL_DEADLINE_SECONDS = 1.0  # a policy answers in microseconds; longer is a loop that does not end


def within_deadline(function: Callable[..., Any], args: tuple, filename: str) -> Any:
    """Call the learner's `function`, stopping it at its line if it runs past CALL_DEADLINE_SECONDS.

    A learner's endless loop runs on the event loop's own thread, where no asyncio timeout can reach
    it; a trace function on the learner's file's lines can, and costs nothing outside that file."""
    deadline = time.monotonic() + CALL_DEADLINE_SECONDS

    def on_line(frame: types.FrameType, event: str, arg: object):
        if event == "line" and time.monotonic() > deadline:
            raise LearnerError(f"{filename}, line {frame.f_lineno}: still running after {CALL_DEADLINE_SECONDS:g} s "
                               "(a loop that never ends?)")
        return on_line

    def on_call(frame: types.FrameType, event: str, arg: object):
        return on_line if frame.f_code.co_filename == filename else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return function(*args)
    finally:
        sys.settrace(previous)


def at_learner_line(error: BaseException, filename: str) -> str:
    """`error` said at the deepest line of `filename` it passed through."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename == filename]
    where = f"{filename}, line {frames[-1].lineno}" if frames else filename
    return f"{where}: {type(error).__name__}: {error}"


def load_queries(text: str, filename: str, expected: Iterable[str]) -> dict[str, str]:
    """The named queries (`-- name: job_retry`) of the learner's SQL file; exactly `expected` must be
    there, each once."""
    try:
        named = sql.parse_named(text, filename)
    except ValueError as error:
        raise LearnerError(str(error)) from None
    expected = list(expected)
    missing = [name for name in expected if name not in named]
    extra = [name for name in named if name not in expected]
    if missing:
        raise LearnerError(f"{filename}: no query named {', '.join(missing)} (each starts with `-- name: <name>`)")
    if extra:
        raise LearnerError(f"{filename}: {', '.join(extra)} is not part of this exercise; "
                           f"it edits {', '.join(expected)}")
    empty = [name for name, body in named.items() if not body.strip()]
    if empty:
        raise LearnerError(f"{filename}: the query {', '.join(empty)} is empty")
    return named


async def try_queries(queries: Mapping[str, str], filename: str, params: Mapping[str, Any]) -> None:
    """Run each of the learner's `queries` once on a scratch database with dummy `params`, in a transaction
    that is rolled back: SQL PostgreSQL refuses is said with its message and the line of the learner's
    file, before any system runs it."""
    with db.scratch_databases("rq_try") as databases:
        async with await psycopg.AsyncConnection.connect(databases.queue_url) as conn:
            for name, text in queries.items():
                try:
                    async with conn.transaction(force_rollback=True):
                        await conn.execute("SET LOCAL statement_timeout = '5s'")
                        await conn.execute(text, params)
                except psycopg.Error as error:
                    raise LearnerError(f"{filename}, {_where(name, text, error)}: "
                                       f"{error.diag.message_primary or error}") from None


def _where(name: str, text: str, error: psycopg.Error) -> str:
    """The query, and the line PostgreSQL pointed at, quoted (comment lines are not in the query text,
    so the line is named by its words rather than a number)."""
    position = error.diag.statement_position
    if not position:
        return f"query {name}"
    line = _as_sent(text)[:int(position) - 1].count("\n")
    return f"query {name}, at `{text.splitlines()[line].strip()}`"


def _as_sent(text: str) -> str:
    """`text` as psycopg sends it, which is what PostgreSQL's error position counts in: each %(name)s a
    $n, numbered by first appearance, and %% a single %. The lines are the same as the learner's."""
    numbers: dict[str, int] = {}

    def sent(match: re.Match) -> str:
        return "%" if match[0] == "%%" else f"${numbers.setdefault(match[1], len(numbers) + 1)}"
    return re.sub(r"%%|%\((\w+)\)s", sent, text)
