"""Loading a learner's code: a Python function or named SQL queries, from the text of their file.

A learner's broken code is bad input: whatever goes wrong (a syntax error, a missing function, an
exception while it runs, SQL PostgreSQL refuses) becomes a `LearnerError` whose message names the file
and the line, never a traceback. What this does not do: decide whether the code is right (the checker
runs it in the real system for that).
"""

from __future__ import annotations

import inspect
import re
import sys
import time
import traceback
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable, Mapping
from typing import Any

import psycopg

from reliableq import sql


class LearnerError(Exception):
    """The learner's code could not be used; the message says where and why, in one or two lines."""


def load_function(text: str, filename: str, name: str, kind: str = "function") -> Callable[..., Any]:
    """The function (or class: `kind`) `name` defined by the Python `text` of the learner's `filename`; a
    call that raises raises LearnerError naming the learner's line. An `async def` gives a LearnerCoroutine
    to await."""
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
        raise LearnerError(f"{filename}: define a {kind} named {name}")
    if inspect.iscoroutinefunction(function):
        def started(*args: Any) -> LearnerCoroutine:
            try:
                return LearnerCoroutine(function(*args), filename)
            except TypeError as error:  # called with arguments it does not take
                raise LearnerError(f"{filename}: {error}") from None
        return started
    return guarded(function, filename)


def guarded(function: Callable[..., Any], filename: str) -> Callable[..., Any]:
    """`function` of the learner's `filename` (a function, a class, or a method of an object it made),
    called within the deadline; a call that raises raises LearnerError naming the learner's line."""
    def call(*args: Any) -> Any:
        try:
            return within_deadline(function, args, filename)
        except LearnerError:
            raise
        except Exception as error:
            raise LearnerError(at_learner_line(error, filename)) from None
    return call


# A policy answers in microseconds; a second of its own CPU time is a loop that does not end. CPU time, not
# the clock's: on a loaded machine a right answer's call was once descheduled for over a second, and its
# check failed "still running" (rule 15: same file, same verdict). The clock's backstop is for a loop that
# waits rather than computes.
CALL_DEADLINE_SECONDS = 1.0
CALL_WALL_SECONDS = 30.0
# The clocks are read once every this many of the learner's lines and opcodes, a fraction of a
# millisecond apart: read at each, they made a policy looping over its attempts (decorrelated jitter)
# take 1.4 ms a call, and its check 30 s.
EVENTS_BETWEEN_CLOCK_READS = 100


def within_deadline(function: Callable[..., Any], args: tuple, filename: str,
                    seconds: float = CALL_DEADLINE_SECONDS) -> Any:
    """Call the learner's `function`, stopping it at its line once it has computed for `seconds` (this
    thread's CPU time), or run for CALL_WALL_SECONDS on the clock.

    A learner's endless loop runs on the event loop's own thread, where no asyncio timeout can reach
    it; a trace function on the learner's file's lines can, and costs nothing outside that file."""
    cpu_deadline = time.thread_time() + seconds
    wall_deadline = time.monotonic() + max(seconds, CALL_WALL_SECONDS)
    until_clock_read = EVENTS_BETWEEN_CLOCK_READS

    def on_line(frame: types.FrameType, event: str, arg: object):
        nonlocal until_clock_read
        if event not in ("line", "opcode"):
            return on_line
        until_clock_read -= 1
        if until_clock_read:
            return on_line
        until_clock_read = EVENTS_BETWEEN_CLOCK_READS
        if time.thread_time() > cpu_deadline or time.monotonic() > wall_deadline:
            raise LearnerError(f"{filename}, line {frame.f_lineno}: still running after {seconds:g} s "
                               "(a loop that never ends?)")
        return on_line

    def on_call(frame: types.FrameType, event: str, arg: object):
        if frame.f_code.co_filename != filename:
            return None
        # Opcodes too: `while True: pass` loops within one line, which raises no new line event.
        frame.f_trace_opcodes = True
        return on_line

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return function(*args)
    finally:
        sys.settrace(previous)


LABS = "_raised_by_the_lab"


def the_labs(error: Exception) -> Exception:
    """`error` marked as raised by the lab, not the learner: their code letting it through passes it on."""
    setattr(error, LABS, True)
    return error


def lab_awaitable(function: Callable[[], Awaitable[Any]]) -> Callable[[], Coroutine[Any, Any, Any]]:
    """`function` (the lab's store or acknowledge, handed to the learner's code) marking what it raises, so
    that an error the learner's code lets through is passed on as it was, not said as the learner's."""
    async def marked() -> Any:
        try:
            return await function()
        except Exception as error:
            raise the_labs(error)  # noqa: B904  (the same exception, marked: its traceback goes on)
    return marked


class LearnerCoroutine:
    """The learner's coroutine, awaited one step at a time: each step (their code from one await to the
    next) runs under within_deadline, and an exception raised in their code becomes a LearnerError at
    their line; an exception from what it awaits (the lab's store and acknowledge, a sleep) that their code
    lets through stays what it was (a database error is the API's to answer, not the learner's mistake).
    What it awaits takes as long as it takes; whoever awaits this bounds the whole (`waiting_at` says where
    it last waited)."""

    def __init__(self, coroutine: Coroutine, filename: str) -> None:
        self.coroutine, self.filename = coroutine, filename
        self.waiting_at: int | None = None  # the line of the learner's file it last waited at

    def __await__(self) -> Generator[Any, Any, Any]:
        step, value = self.coroutine.send, None
        while True:
            try:
                waiting_on = within_deadline(step, (value,), self.filename)
            except StopIteration as returned:
                return returned.value
            except LearnerError:
                raise
            except Exception as error:
                if getattr(error, LABS, False):  # raised by what the lab handed the learner, let through
                    raise
                raise LearnerError(at_learner_line(error, self.filename)) from None
            self.waiting_at = self.coroutine.cr_frame.f_lineno
            try:
                step, value = self.coroutine.send, (yield waiting_on)
            except BaseException as error:  # a cancellation (or a crash) thrown in: met at the learner's await
                step, value = self.coroutine.throw, error


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


async def try_queries(queries: Mapping[str, str], filename: str, database_url: str, params: Mapping[str, Any] | None,
                      returning: Iterable[str] = ()) -> None:
    """Run each of the learner's `queries` once with `params` on the (scratch) database at `database_url`,
    in a transaction that is rolled back: SQL PostgreSQL refuses is said with its message and the line of
    the learner's file, and so is a query named in `returning` that returns no rows at all (the caller
    reads its rows)."""
    returning = set(returning)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        for name, text in queries.items():
            try:
                async with conn.transaction(force_rollback=True):
                    await conn.execute("SET LOCAL statement_timeout = '5s'")
                    cursor = await conn.execute(text, params)
            except psycopg.Error as error:
                raise LearnerError(f"{filename}, {_where(name, text, error)}: "
                                   f"{error.diag.message_primary or error}") from None
            if name in returning and cursor.description is None:
                raise LearnerError(f"{filename}, query {name}: it must return rows (end it with a SELECT, or "
                                   "RETURNING), and it returns none")


def _where(name: str, text: str, error: psycopg.Error) -> str:
    """The query, and the line PostgreSQL pointed at, quoted (comment lines are not in the query text,
    so the line is named by its words rather than a number)."""
    position = error.diag.statement_position
    if not position:
        return f"query {name}"
    line = _as_sent(text)[:int(position) - 1].count("\n")  # the same line in both: a placeholder holds no newline
    return f"query {name}, at `{text.splitlines()[line].strip()}`"


def _as_sent(text: str) -> str:
    """`text` as psycopg sends it, which is what PostgreSQL's error position counts in: each %(name)s
    becomes $n, numbered in order of first use, and %% becomes %."""
    numbers: dict[str, int] = {}

    def sent(match: re.Match) -> str:
        return "%" if match[0] == "%%" else f"${numbers.setdefault(match[1], len(numbers) + 1)}"
    return re.sub(r"%%|%\((\w+)\)s", sent, text)
