"""The learner's workspace: one file per exercise, backups of anything replaced, and progress (todo,
failing, passed; hints seen) in a small JSON file beside them, never in a notebook's metadata. Where it
is: reliableq/lab/places.py (one folder for the CLI and the notebooks).

Nothing here ever overwrites a learner's file without first copying it into `backups/`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.places import workspace_folder

PROGRESS = "progress.json"
COPIED = "notebooks.json"  # each notebook copied in: the digest of the shipped version it was copied from


class Workspace:
    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder).expanduser().resolve() if folder is not None else workspace_folder()

    def path(self, exercise: Exercise) -> Path:
        return self.folder / exercise.filename

    def ready(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        ignore = self.folder / ".gitignore"
        if not ignore.exists():  # the learner's answers stay out of the repository they cloned
            ignore.write_text("*\n")

    # -- files ---------------------------------------------------------------------------------

    def starter(self, exercise: Exercise) -> str:
        """This learner's starter: made from their own passed answer where the exercise builds on an earlier
        one, else the shipped starter."""
        if exercise.builds_on is not None:
            earlier, filename, make = exercise.builds_on
            answer = self.folder / filename
            if self.progress().get(earlier, {}).get("state") == "passed" and answer.exists():
                return make(answer.read_text()) or exercise.starter
        return exercise.starter

    def start(self, exercise: Exercise) -> tuple[Path, bool]:
        """Write the starter unless the learner's file is already there; (its path, whether written)."""
        path = self.path(exercise)
        if path.exists():
            return path, False
        self.ready()
        path.write_text(self.starter(exercise))
        return path, True

    def reset(self, exercise: Exercise) -> tuple[Path, Path | None]:
        """Put the starter back; (the file, where the learner's version was backed up, if there was one)."""
        path = self.path(exercise)
        backup = self.back_up(path) if path.exists() else None
        self.ready()
        path.write_text(self.starter(exercise))
        return path, backup

    def back_up(self, path: Path) -> Path:
        folder = self.folder / "backups"
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = folder / f"{path.stem}-{stamp}{path.suffix}"
        number = 1
        while backup.exists():
            number += 1
            backup = folder / f"{path.stem}-{stamp}-{number}{path.suffix}"
        shutil.copy2(path, backup)
        return backup

    def read(self, exercise: Exercise) -> str | None:
        path = self.path(exercise)
        return path.read_text() if path.exists() else None

    # -- progress ------------------------------------------------------------------------------

    def progress(self) -> dict[str, dict]:
        path = self.folder / PROGRESS
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:  # a damaged progress file loses the record, never the learner's code
            return {}

    def state(self, exercise: Exercise) -> str:
        return self.progress().get(exercise.name, {}).get("state", "todo")

    def record(self, exercise: Exercise, **fields: object) -> None:
        progress = self.progress()
        progress[exercise.name] = progress.get(exercise.name, {}) | fields
        self.ready()
        (self.folder / PROGRESS).write_text(json.dumps(progress, indent=2, sort_keys=True) + "\n")

    def record_check(self, exercise: Exercise, text: str, passed: bool, lines: list[str]) -> None:
        """A verdict on `text` (the file as it was graded): its state, and what a hint reads back later."""
        failed_on = next((line for line in lines if line.startswith("✗")), None)
        self.record(exercise, state="passed" if passed else "failing", checked=_digest(text), failed_on=failed_on)

    def next_hint(self, exercise: Exercise) -> str:
        """The next hint (the last one again once all were seen), after a line on the learner's file as saved:
        still the starter, or where its last check left it, or changed since."""
        record = self.progress().get(exercise.name, {})
        number = min(record.get("hints", 0) + 1, len(exercise.hints))
        self.record(exercise, hints=number)
        text = self.read(exercise)
        if text is None:
            yours = f"You have no {exercise.filename} yet (Reset, or `reliableq exercise start {exercise.name}`)."
        elif text in (exercise.starter, self.starter(exercise)):
            yours = "Your file is still the starter."
        elif record.get("checked") != _digest(text):
            yours = "Your file changed since its last check: Check it to see where it stands now."
        elif record.get("state") == "passed":
            yours = "Your file as saved passed its last check."
        else:
            yours = f"Your file as saved, at its last check: {record.get('failed_on') or 'it failed'}"
        return f"{yours}\nHint {number} of {len(exercise.hints)}: {exercise.hints[number - 1]}"

    # -- notebooks -----------------------------------------------------------------------------

    def copy_notebooks(self, shipped: Path, fresh: bool = False) -> tuple[list[str], list[str]]:
        """Copy each of the clone's notebooks in `shipped` that is not here yet, so a learner saves their own
        copy and never the clone's. A copy whose shipped notebook changed since (a `git pull`) is kept, unless
        `fresh`: then it is backed up and replaced. Returns (the notebooks copied, those kept though the
        clone's changed)."""
        self.ready()
        record_path = self.folder / COPIED
        try:
            record = json.loads(record_path.read_text())
        except (FileNotFoundError, ValueError):
            record = {}
        copied, stale = [], []
        for source in sorted(shipped.glob("*.ipynb")):
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
            target = self.folder / source.name
            if target.exists():
                if record.get(source.name) == digest:
                    continue  # the learner's copy of the clone's notebook as it is
                if not fresh:
                    stale.append(source.name)
                    continue
                self.back_up(target)
            shutil.copy2(source, target)
            record[source.name] = digest
            copied.append(source.name)
        record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        return copied, stale


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
