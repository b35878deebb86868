"""The lab's fault plan (reliableq/lab/faults.py) over the core's fault points (reliableq/hooks.py)."""

from __future__ import annotations

import pytest

from reliableq.hooks import POINTS, FaultHook
from reliableq.lab.faults import (
    API_KILL_POINTS,
    CRASH_POINTS,
    LOST_ANSWER_POINTS,
    PAUSE_POINTS,
    STALLING_POINTS,
    FaultPlan,
)


def test_fault_points_are_named():
    """Arming an unknown point is an error, not a silent no-op."""
    with pytest.raises(ValueError, match="unknown fault point"):
        FaultPlan().arm_crash("somewhere")


def test_every_point_the_lab_arms_is_a_point_the_core_passes():
    """A fault armed at a name the core never reaches would never fire: each one is in hooks.POINTS."""
    assert set(CRASH_POINTS + PAUSE_POINTS + STALLING_POINTS + LOST_ANSWER_POINTS + API_KILL_POINTS) <= set(POINTS)


def test_a_lost_submission_answer_is_armed_only_as_a_real_kill():
    """In process the client would hear the 500 of a failed request: only a killed process says nothing."""
    with pytest.raises(ValueError, match="only with a real kill"):
        FaultPlan().arm_crash("after_commit_before_ack")
    FaultPlan().arm_crash("after_commit_before_ack", real_kill=True)


async def test_the_core_hook_does_nothing_and_a_fault_plan_is_one():
    """Production's hook returns at every point; the lab's FaultPlan stands in for it."""
    for point in POINTS:
        assert await FaultHook().reach(point, object(), "w") is None
    assert isinstance(FaultPlan(), FaultHook)
