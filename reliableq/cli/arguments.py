"""What every family of `reliableq` commands shares: argument types, the --off switch, UsageError (a
one-line error for people), and how a command runs its coroutine (on uvloop where installed)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import textwrap
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from reliableq.config import Mechanisms

T = TypeVar("T")
Number = TypeVar("Number", int, float)


class WholeWordsHelp(argparse.HelpFormatter):
    """Help text wrapped at spaces only: a name such as sync-standby is never split at its hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class UsageError(Exception):
    """Bad arguments the parser could not catch by itself."""


def mechanisms_from(args: argparse.Namespace) -> Mechanisms:
    # skip-locked as the stages and exercises spell it, or skip_locked as the mechanisms do
    names = [n.strip().replace("-", "_") for n in (args.off or "").split(",") if n.strip()]
    try:
        return Mechanisms().without(*names)
    except ValueError as error:
        raise UsageError(f"--off: {error}") from error


def add_mechanism_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--off", metavar="MECHANISMS", default="",
                        help="comma-separated mechanisms to switch off: " + ",".join(Mechanisms.names()))


def _checked(text: str, convert: Callable[[str], Number], holds: Callable[[Number], bool], expected: str) -> Number:
    """`text` converted, if it converts and the value holds; else argparse's one-line error saying what was
    expected (not "invalid <function name> value", argparse's own wording for a ValueError)."""
    try:
        value = convert(text)
    except ValueError:
        value = None
    if value is None or not holds(value):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text}")
    return value


def positive_float(text: str) -> float:
    return _checked(text, float, lambda value: math.isfinite(value) and value > 0, "a positive number")


def non_negative_float(text: str) -> float:
    return _checked(text, float, lambda value: math.isfinite(value) and value >= 0, "zero or a positive number")


def seconds_from(given: float | None, variable: str, default: float) -> float:
    """An option's value if given, else the environment's `variable`, else `default`; a variable that is
    not a positive number of seconds is a UsageError naming it."""
    if given is not None:
        return given
    configured = os.environ.get(variable)
    if configured is None:
        return default
    try:
        return positive_float(configured)
    except (ValueError, argparse.ArgumentTypeError):
        raise UsageError(f"{variable} must be a positive number of seconds, got {configured!r}") from None


def check_fleet_limit(fleet_limit: int | None, mechanisms: Mechanisms) -> None:
    if fleet_limit and not (mechanisms.skip_locked and mechanisms.leases):
        raise UsageError("--fleet-limit needs the skip_locked and leases mechanisms on")


def positive_int(text: str) -> int:
    return _checked(text, int, lambda value: value >= 1, "at least 1")


def tcp_port(text: str) -> int:
    return _checked(text, int, lambda value: 1 <= value <= 65535, "a TCP port between 1 and 65535")


def rate(text: str) -> float:
    return _checked(text, float, lambda value: 0 <= value <= 1, "between 0 and 1")


def job_uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a UUID)") from None


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def run_coroutine(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop where it is installed (Linux, macOS): a worker's CPU per job (claim, HTTP
    call, finalize) is what bounds its throughput, and uvloop cut it by a fifth (`reliableq bench`)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
