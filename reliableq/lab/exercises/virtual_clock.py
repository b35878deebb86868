"""A clock the check controls, for grading a learner's asyncio code (exercise 02's accept).

`run(main, filename)` runs the coroutine `main` in an event loop of its own whose time is virtual: when
nothing is ready the clock jumps to the next timer instead of sleeping, and each turn of the loop with
work to do costs TURN_SECONDS. A check can so hold a step (a store) until a moment far beyond any
plausible timeout, and every timeout the learner set fires first and is seen, in milliseconds of real
time. Nothing depends on the machine's speed: the same code meets the same moments on every run, loaded
or not. The learner's own frames (code compiled as `filename`) read the same clock through the time
module: time.monotonic(), time.perf_counter(), time.time() and their _ns forms, called as `time.x()` or
imported by name while `learners_time()` is in force (exercise 02 loads the learner's file under it).
Everything else, the lab's real-time guards included, reads the real clock.

Boundary: nothing in the loop may wait on the outside world (a socket, a thread): with nothing ready and
no timer set nothing can ever happen, and the run stops with Stalled. datetime.now() is not controlled.
Code that keeps the loop busy without end (or wakes every few microseconds of the clock) is stopped by
real time: after `real_seconds` the clock jumps to `give_up_at`, so every deadline set before then fires.
"""

from __future__ import annotations

import asyncio
import selectors
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

Value = TypeVar("Value")

# What one turn of the loop with work ready costs on the virtual clock: without it a loop that only ever
# yields (`await asyncio.sleep(0)` until a task is done) would wait for a held step that is never let go.
TURN_SECONDS = 0.01


class Stalled(RuntimeError):
    """Nothing is ready and no timer is set: nothing in the loop can ever happen again."""


class _JumpingSelector(selectors.DefaultSelector):
    """A selector whose wait moves the virtual clock instead of sleeping."""

    def __init__(self, real_seconds: float, give_up_at: float) -> None:
        super().__init__()
        self.now = 0.0
        self.real_deadline = time.monotonic() + real_seconds
        self.give_up_at = give_up_at

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if time.monotonic() > self.real_deadline:
            self.now = max(self.now, self.give_up_at)
        if ready:
            return ready
        if timeout is None:
            raise Stalled("nothing is ready and no timer is set: the run would wait for ever")
        self.now += timeout or TURN_SECONDS
        return ready


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self, filename: str, real_seconds: float, give_up_at: float) -> None:
        self.filename = filename  # whose frames read this clock through the time module
        self.selector = _JumpingSelector(real_seconds, give_up_at)
        self.epoch = _REAL["time"]()  # what time.time() says at virtual 0
        super().__init__(self.selector)

    def time(self) -> float:
        return self.selector.now


def run(main: Callable[[], Coroutine[Any, Any, Value]], filename: str, real_seconds: float,
        give_up_at: float) -> Value:
    """`main()` run to its end on a virtual clock starting at 0 (see the module's docstring), on this thread,
    which must have no running loop (call it through asyncio.to_thread)."""
    loop = VirtualClockLoop(filename, real_seconds, give_up_at)
    _active.loop = loop
    try:
        with learners_time():
            return loop.run_until_complete(main())
    finally:
        _active.loop = None
        loop.close()


# -- the time module as the learner's frames see it -------------------------------------------------

_active = threading.local()  # .loop: the VirtualClockLoop running on this thread, if any
_REAL: dict[str, Callable[[], float | int]] = {name: getattr(time, name) for name in (
    "monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns")}


def _virtual(name: str, loop: VirtualClockLoop) -> float | int:
    seconds = loop.time() + (loop.epoch if name.startswith("time") else 0.0)
    return int(seconds * 1e9) if name.endswith("_ns") else seconds


def _read(name: str) -> Callable[[], float | int]:
    real = _REAL[name]

    def read() -> float | int:
        loop = getattr(_active, "loop", None)
        if loop is not None and sys._getframe(1).f_code.co_filename == loop.filename:
            return _virtual(name, loop)
        return real()
    read.__name__ = name
    return read


_LEARNERS = {name: _read(name) for name in _REAL}
_patches = 0
_patching = threading.Lock()


@contextmanager
def learners_time() -> Iterator[None]:
    """The time module's clocks replaced, while in force, by ones that answer a learner's frame running
    in a VirtualClockLoop with the virtual time, and any other caller (or any thread without such a loop)
    with the real one. A learner's `from time import monotonic` made meanwhile keeps the replacement."""
    global _patches
    with _patching:
        _patches += 1
        for name, read in _LEARNERS.items():
            setattr(time, name, read)
    try:
        yield
    finally:
        with _patching:
            _patches -= 1
            if not _patches:
                for name, real in _REAL.items():
                    setattr(time, name, real)
