"""The benchmark's progress bar: one line on stderr, redrawn in place on a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line textual progress bar on stderr (one line per step when stderr is not a terminal)."""

    WIDTH = 28

    def __init__(self, total: int, enabled: bool = True, stream=None) -> None:
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.stream = stream or sys.stderr
        self.started = time.monotonic()

    def show(self, label: str) -> None:
        if not self.enabled:
            return
        filled = int(self.WIDTH * self.done / self.total)
        line = (f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} "
                f"{time.monotonic() - self.started:5.0f}s {label}")
        if self.stream.isatty():
            self.stream.write("\r" + line[:110].ljust(110))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def step(self, label: str) -> None:
        self.done += 1
        self.show(label)

    def close(self) -> None:
        if self.enabled and self.stream.isatty():
            self.stream.write("\n")
