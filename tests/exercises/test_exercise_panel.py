"""The notebooks' ExercisePanel on real PostgreSQL: Check of the reference passes and shows the stage's run;
Check of the starter fails with the checker's verdict; each is recorded in the workspace's progress. The
reference's Check is also fencing's whole-checker pass (forced schedules, scenario, earlier exercises, chaos)."""

from __future__ import annotations

import pytest

from reliableq.lab.exercises import fencing
from reliableq.lab.exercises.checker import Outcome
from reliableq.lab.exercises.panel import ExercisePanel


@pytest.mark.slow
async def test_checking_the_reference_passes_and_the_starter_fails_through_the_panel(tmp_path):
    panel = ExercisePanel(fencing.EXERCISE, tmp_path, seeds=1)
    assert panel.hint().startswith("Your file is still the starter")
    result = await panel.run()  # the starter, as the panel wrote it
    assert panel.message.value == ""  # what the hint said of the file before this check is gone with it
    assert result.outcome is Outcome.FAILED
    assert panel.output.outputs[0]["text"].startswith("✗ Broken: ")  # a forced schedule, named
    assert panel.workspace.state(fencing.EXERCISE) == "failing" and panel.solution_button.disabled

    panel.path.write_text(fencing.REFERENCE)
    result = await panel.run()
    assert result.outcome is Outcome.PASSED, result.text()
    shown = panel.output.outputs
    # The earlier stages' exercises run again between the stage's scenario and chaos, as the CLI runs them.
    assert shown[0]["text"].startswith("✓ fencing passed: forced schedules, stage 05's scenario (seed 1), ")
    assert "chaos seed 1.\nGraded fencing.sql as saved at " in shown[0]["text"]  # which version was graded
    # Beside the pass, the run's expected C=2 is introduced as a later stage's before the run says it broke.
    assert shown[1]["text"].startswith("Your code in the stage's run, as the check saw it. What broke there is "
                                       "left to a later stage")
    assert shown[2]["text"].startswith("Stage 05 fencing")  # the run's summary, then its table and charts
    assert len(shown) > 3
    assert panel.workspace.state(fencing.EXERCISE) == "passed" and not panel.solution_button.disabled
