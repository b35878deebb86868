"""A learner's progress through the exercises, as a line a person reads, a record a tool reads, and a
room's records side by side for the instructor.

A room collects progress without any server: each learner runs `reliableq exercise progress --to DIR` with
DIR a folder everyone can write (a shared drive, a synced folder) or pastes the line it prints into the
room's chat; `reliableq exercise room DIR` then shows who passed what.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import time
from collections.abc import Iterable
from pathlib import Path

from reliableq.lab.exercises.exercise import Exercise
from reliableq.lab.exercises.workspace import Workspace

MARKS = {"passed": "✓", "failing": "✗", "todo": "·"}
_SAFE_FILE_NAME = re.compile(r"[^A-Za-z0-9_.@-]+")


def learner_name() -> str:
    """Who this learner is, unless they say: their login at this machine."""
    return f"{getpass.getuser()}@{socket.gethostname()}"


def snapshot(workspace: Workspace, exercises: Iterable[Exercise], learner: str) -> dict:
    """Where `learner` stands: each exercise's state and the hints seen, and when this was taken."""
    recorded = workspace.progress()
    return {"learner": learner, "taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "workspace": str(workspace.folder),
            "exercises": [{"stage": exercise.stage_number, "name": exercise.name,
                           "state": recorded.get(exercise.name, {}).get("state", "todo"),
                           "hints": recorded.get(exercise.name, {}).get("hints", 0)}
                          for exercise in exercises]}


def line(taken: dict) -> str:
    """One line: how many passed, then each exercise's mark (✓ passed, ✗ failing, · not tried)."""
    rows = taken["exercises"]
    passed = sum(row["state"] == "passed" for row in rows)
    marks = " ".join(f"{row['stage']:02d}{MARKS[row['state']]}" for row in rows)
    return f"{taken['learner']}: {passed} of {len(rows)} passed  {marks}"


def yours(workspace: Workspace | None = None) -> str:
    """The learner's own line, as the notebooks show it: the workspace's (reliableq/lab/places.py) unless
    another is given."""
    from reliableq.lab.exercises import EXERCISES
    return line(snapshot(workspace or Workspace(), EXERCISES.values(), learner="Your progress"))


def write(taken: dict, folder: Path) -> Path:
    """Put the record in `folder`, one file per learner (a later record replaces their earlier one)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_SAFE_FILE_NAME.sub('_', taken['learner'])}.json"
    path.write_text(json.dumps(taken, indent=2) + "\n")
    return path


def _is_record(record: object) -> bool:
    return (isinstance(record, dict) and isinstance(record.get("learner"), str)
            and isinstance(record.get("taken_at"), str) and isinstance(record.get("exercises"), list)
            and all(isinstance(row, dict) and isinstance(row.get("stage"), int) and row.get("state") in MARKS
                    for row in record["exercises"]))


def room(folder: Path) -> list[str]:
    """The records in `folder` as a table: one row per learner, one column per exercise, and a last row
    counting the passes of each exercise. A file that is not a record is named and left out."""
    taken, skipped = [], []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except ValueError:
            record = None
        if _is_record(record):
            taken.append(record)
        else:
            skipped.append(path.name)
    if not taken:
        return [f"no progress records in {folder} yet"] + [f"(not a record: {name})" for name in skipped]
    stages = sorted({row["stage"] for record in taken for row in record["exercises"]})
    width = max(len(record["learner"]) for record in taken)
    lines = [f"{'learner':<{width}}  " + " ".join(f"{stage:02d}" for stage in stages) + "  passed  as of"]
    for record in sorted(taken, key=lambda r: r["learner"]):
        states = {row["stage"]: row["state"] for row in record["exercises"]}
        passed = sum(state == "passed" for state in states.values())
        marks = " ".join(f" {MARKS[states.get(stage, 'todo')]}" for stage in stages)
        lines.append(f"{record['learner']:<{width}}  {marks}  {passed:>6}  {record['taken_at']}")
    totals = [sum(row["stage"] == stage and row["state"] == "passed"
                  for record in taken for row in record["exercises"]) for stage in stages]
    lines.append(f"{'passed by':<{width}}  " + " ".join(f"{total:>2}" for total in totals))
    return lines + [f"(not a record: {name})" for name in skipped]
