"""The exercise workspace and the CLI verbs that need no database: a learner's file is never lost,
progress lives in the workspace, hints come one at a time, and the solution waits for a pass."""

from __future__ import annotations

import json

import pytest

from reliableq.cli.main import main
from reliableq.lab.exercises import EXERCISES, backoff, leases, skip_locked
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
    seen = [workspace.next_hint(EXERCISE).splitlines()[-1] for _ in range(len(EXERCISE.hints) + 1)]
    last = len(EXERCISE.hints)
    assert seen == [f"Hint {n} of {last}: {EXERCISE.hints[n - 1]}" for n in [*range(1, last + 1), last]]


def test_a_hint_first_says_where_the_learners_file_stands(tmp_path):
    """Read from the file as saved and the record of its last check: a hint is about this learner's code."""
    workspace = Workspace(tmp_path)
    assert workspace.next_hint(EXERCISE).startswith("You have no backoff.py yet")
    path, _ = workspace.start(EXERCISE)
    assert workspace.next_hint(EXERCISE).startswith("Your file is still the starter.\nHint ")
    path.write_text("my try")
    workspace.record_check(EXERCISE, "my try", False, ["  step 1/3", "✗ Broken: a delay above the cap", "  x"])
    assert workspace.next_hint(EXERCISE).startswith(
        "Your file as saved, at its last check: ✗ Broken: a delay above the cap\nHint ")
    path.write_text("my second try")
    assert workspace.next_hint(EXERCISE).startswith("Your file changed since its last check")
    workspace.record_check(EXERCISE, "my second try", True, ["✓ backoff passed"])
    assert workspace.next_hint(EXERCISE).startswith("Your file as saved passed its last check.")
    assert workspace.state(EXERCISE) == "passed"


def test_the_cli_lists_starts_hints_and_keeps_the_solution_until_a_pass(tmp_path, capsys):
    ws = ["--workspace", str(tmp_path)]
    assert main(["exercise", "list", *ws]) == 0
    said, *listed = capsys.readouterr().out.splitlines()
    assert said == f"workspace: {tmp_path}"
    assert [line.split()[1] for line in listed] == list(EXERCISES)  # in stage order
    assert set(listed) >= {  # names padded to the longest
        "02 commit-before-ack todo     accept(store, acknowledge): in which order the API stores a job and answers 202",
        "05 fencing           todo     the lease-token condition of renew, succeed, retry and dead (SQL)",
        "06 idempotency       todo     the charge service's insert: one charge per idempotency key (SQL)",
        "07 backoff           todo     retry_delay(attempt, base, cap, rng): capped exponential backoff with full "
        "jitter"}
    assert main(["exercise", "start", "backoff", *ws]) == 0
    assert (tmp_path / "backoff.py").read_text() == EXERCISE.starter
    assert main(["exercise", "hint", "backoff", *ws]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "Your file is still the starter.", f"Hint 1 of {len(EXERCISE.hints)}: {EXERCISE.hints[0]}"]
    assert main(["exercise", "solution", "backoff", *ws]) == 2
    assert "--give-up" in capsys.readouterr().err
    assert main(["exercise", "solution", "backoff", "--give-up", *ws]) == 0
    assert "# Why it works:" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["backoff", "fencing"])
def test_the_printed_solution_pasted_whole_into_the_file_is_the_reference_and_comments(name, tmp_path, capsys):
    """A learner who gives up and pastes everything printed gets a file that loads: the why is comments."""
    assert main(["exercise", "solution", name, "--give-up", "--workspace", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    exercise = EXERCISES[name]
    comment = "#" if exercise.filename.endswith(".py") else "--"
    assert printed.startswith(exercise.reference.rstrip() + "\n\n")
    assert all(line.startswith(f"{comment} ") for line in printed.removeprefix(exercise.reference.rstrip())
               .strip().splitlines())
    exercise.load(printed)  # no error: what was printed loads as the learner's file would


@pytest.mark.parametrize("argv, said", [
    (["exercise", "start", "nosuch"], f"no exercise named 'nosuch'; there are: {', '.join(EXERCISES)}"),
    (["exercise", "check"], f"name an exercise: {', '.join(EXERCISES)}"),
    (["exercise", "check", "backoff"], "reliableq exercise start backoff"),
])
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, capsys, argv, said):
    assert main([*argv, "--workspace", str(tmp_path)]) == 2
    assert said in capsys.readouterr().err


def test_progress_is_one_line_to_paste_and_a_room_reads_every_learners_record(tmp_path, capsys):
    ann, bob, room = tmp_path / "ann", tmp_path / "bob", tmp_path / "room"
    Workspace(ann).record(EXERCISE, state="passed")
    Workspace(ann).record(EXERCISES["fencing"], state="failing")
    assert main(["exercise", "progress", "--workspace", str(ann), "--learner", "ann", "--to", str(room)]) == 0
    assert capsys.readouterr().out == "ann: 1 of 10 passed  02· 03· 04· 05✗ 06· 07✓ 08· 09· 10· 11·\n"
    # A learner's name never leaves the room's folder.
    assert main(["exercise", "progress", "--workspace", str(bob), "--learner", "bob/../x", "--to", str(room)]) == 0
    assert sorted(p.name for p in room.iterdir()) == ["ann.json", "bob_.._x.json"]
    (room / "notes.json").write_text("{not a record")
    capsys.readouterr()
    assert main(["exercise", "room", str(room)]) == 0
    header, first, second, totals, skipped = capsys.readouterr().out.splitlines()
    assert header.split() == ["learner", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "passed", "as",
                              "of"]
    assert first.split()[:12] == ["ann", "·", "·", "·", "✗", "·", "✓", "·", "·", "·", "·", "1"]
    assert second.split()[:12] == ["bob/../x", *["·"] * 10, "0"]
    assert totals.split() == ["passed", "by", "0", "0", "0", "0", "0", "1", "0", "0", "0", "0"]
    assert skipped == "(not a record: notes.json)"


def test_list_json_is_a_record_for_tools(tmp_path, capsys):
    Workspace(tmp_path).record(EXERCISE, state="passed", hints=2)
    assert main(["exercise", "list", "--json", "--workspace", str(tmp_path), "--learner", "ann"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["learner"] == "ann" and record["workspace"] == str(tmp_path)
    assert {"stage": 7, "name": "backoff", "state": "passed", "hints": 2} in record["exercises"]
    assert [row["name"] for row in record["exercises"]] == list(EXERCISES)


def test_the_room_of_an_empty_folder_says_so(tmp_path, capsys):
    assert main(["exercise", "room", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"no progress records in {tmp_path} yet\n"
    assert main(["exercise", "room"]) == 2


def test_the_clones_notebooks_are_copied_once_and_a_changed_one_replaced_only_when_asked(tmp_path):
    shipped, workspace = tmp_path / "notebooks", Workspace(tmp_path / "ws")
    shipped.mkdir()
    (shipped / "01_a.ipynb").write_text("v1")
    assert workspace.copy_notebooks(shipped) == (["01_a.ipynb"], [])
    (workspace.folder / "01_a.ipynb").write_text("my notes")  # the learner saved their copy
    assert workspace.copy_notebooks(shipped) == ([], [])  # theirs is kept
    (shipped / "01_a.ipynb").write_text("v2")  # a git pull changed the clone's
    assert workspace.copy_notebooks(shipped) == ([], ["01_a.ipynb"])
    assert (workspace.folder / "01_a.ipynb").read_text() == "my notes"
    assert workspace.copy_notebooks(shipped, fresh=True) == (["01_a.ipynb"], [])
    assert (workspace.folder / "01_a.ipynb").read_text() == "v2"
    (backup,) = (workspace.folder / "backups").iterdir()
    assert backup.read_text() == "my notes"
    assert (workspace.folder / ".gitignore").read_text() == "*\n"


def test_leases_starts_from_the_learners_own_passed_claim_of_skip_locked(tmp_path):
    """04's file holds 03's claim: once 03 passed, it starts from the learner's own lock, not the reference's;
    before that, or from a claim whose lease lines were rewritten, from the shipped starter."""
    assert leases.starter_on(skip_locked.REFERENCE) == leases.STARTER
    own = skip_locked.REFERENCE.replace("FOR UPDATE SKIP LOCKED", "FOR NO KEY UPDATE SKIP LOCKED")
    workspace = Workspace(tmp_path)
    (tmp_path / skip_locked.FILENAME).write_text(own)
    workspace.record(skip_locked.EXERCISE, state="failing")
    assert workspace.starter(leases.EXERCISE) == leases.STARTER  # not passed: nothing of theirs is taken
    workspace.record(skip_locked.EXERCISE, state="passed")
    path, _ = workspace.start(leases.EXERCISE)
    started = path.read_text()
    assert "FOR NO KEY UPDATE SKIP LOCKED" in started and leases.RECLAIM_MARK in started
    assert started == leases.STARTER.replace("FOR UPDATE SKIP LOCKED", "FOR NO KEY UPDATE SKIP LOCKED")
    assert workspace.next_hint(leases.EXERCISE).startswith("Your file is still the starter.")
    (tmp_path / skip_locked.FILENAME).write_text(own.replace("%(reclaim_expired)s", "false"))
    assert workspace.starter(leases.EXERCISE) == leases.STARTER
