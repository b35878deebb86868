"""The lab's fault plan (reliableq/lab/faults.py) over the core's fault points (reliableq/hooks.py)."""

from __future__ import annotations

import pytest

from reliableq.hooks import POINTS, FaultHook
from reliableq.lab.faults import CRASH_POINTS, LOST_ANSWER_POINTS, PAUSE_POINTS, STALLING_POINTS, FaultPlan


def test_fault_points_are_named():
    """Arming an unknown point is an error, not a silent no-op."""
    with pytest.raises(ValueError, match="unknown fault point"):
        FaultPlan().arm_crash("somewhere")


def test_every_point_the_lab_arms_is_a_point_the_core_passes():
    """A fault armed at a name the core never reaches would never fire: each one is in hooks.POINTS."""
    assert set(CRASH_POINTS + PAUSE_POINTS + STALLING_POINTS + LOST_ANSWER_POINTS) <= set(POINTS)


async def test_the_core_hook_does_nothing_and_a_fault_plan_is_one():
    """Production's hook returns at every point; the lab's FaultPlan stands in for it."""
    for point in POINTS:
        assert await FaultHook().reach(point, object(), "w") is None
    assert isinstance(FaultPlan(), FaultHook)
