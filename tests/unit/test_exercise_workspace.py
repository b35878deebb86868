"""The exercise workspace and the CLI verbs that need no database: a learner's file is never lost,
progress lives in the workspace, hints come one at a time, and the solution waits for a pass."""

from __future__ import annotations

import pytest

from reliableq.cli.main import main
from reliableq.lab.exercises import EXERCISES, backoff
from reliableq.lab.exercises.workspace import Workspace

EXERCISE = backoff.EXERCISE


def test_start_writes_the_starter_once_and_never_overwrites_the_learners_file(tmp_path):
    workspace = Workspace(tmp_path / "ws")
    path, written = workspace.start(EXERCISE)
    assert written and path.read_text() == EXERCISE.starter
    path.write_text("my work")
    assert workspace.start(EXERCISE) == (path, False) and path.read_text() == "my work"
    assert (tmp_path / "ws" / ".gitignore").read_text() == "*\n"


def test_reset_brings_the_starter_back_and_keeps_every_version_in_backups(tmp_path):
    workspace = Workspace(tmp_path)
    path, _ = workspace.start(EXERCISE)
    versions = ["first try", "second try"]
    backups = []
    for version in versions:
        path.write_text(version)
        _, backup = workspace.reset(EXERCISE)
        backups.append(backup)
    assert path.read_text() == EXERCISE.starter
    assert [b.read_text() for b in backups] == versions and len(set(backups)) == 2


def test_progress_is_todo_then_what_the_last_check_said(tmp_path):
    workspace = Workspace(tmp_path)
    assert workspace.state(EXERCISE) == "todo"
    workspace.record(EXERCISE, state="failing")
    assert workspace.state(EXERCISE) == "failing"
    (tmp_path / "progress.json").write_text("{not json")
    assert workspace.state(EXERCISE) == "todo"  # a damaged record is lost, the learner's code is not


def test_hints_come_one_at_a_time_and_the_last_repeats(tmp_path):
    workspace = Workspace(tmp_path)
    seen = [workspace.next_hint(EXERCISE) for _ in range(len(EXERCISE.hints) + 1)]
    assert [number for number, _ in seen] == [*range(1, len(EXERCISE.hints) + 1), len(EXERCISE.hints)]
    assert seen[0][1] == EXERCISE.hints[0]


def test_the_cli_lists_starts_hints_and_keeps_the_solution_until_a_pass(tmp_path, capsys):
    ws = ["--workspace", str(tmp_path)]
    assert main(["exercise", "list", *ws]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in listed] == list(EXERCISES)  # in stage order
    assert ("07 backoff      todo     retry_delay(attempt, base, cap, rng): capped exponential backoff with "
            "full jitter") in listed
    assert main(["exercise", "start", "backoff", *ws]) == 0
    assert (tmp_path / "backoff.py").read_text() == EXERCISE.starter
    assert main(["exercise", "hint", "backoff", *ws]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"Hint 1 of {len(EXERCISE.hints)}: {EXERCISE.hints[0]}"
    assert main(["exercise", "solution", "backoff", *ws]) == 2
    assert "--give-up" in capsys.readouterr().err
    assert main(["exercise", "solution", "backoff", "--give-up", *ws]) == 0
    assert "Why it works:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, said", [
    (["exercise", "start", "nosuch"], f"no exercise named 'nosuch'; there are: {', '.join(EXERCISES)}"),
    (["exercise", "check"], f"name an exercise: {', '.join(EXERCISES)}"),
    (["exercise", "check", "backoff"], "reliableq exercise start backoff"),
])
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, capsys, argv, said):
    assert main([*argv, "--workspace", str(tmp_path)]) == 2
    assert said in capsys.readouterr().err
