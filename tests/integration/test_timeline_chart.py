"""The timeline shows what a stranded job looks like: with leases off, worker-1's claim stays open to the end of
the run and the 2.5 lease lengths worker-2 waited in vain are drawn as time in which nothing happened (they
were once squeezed into the first 0.05 s); with leases on, every attempt ends and no quiet stretch is marked.
It shows what stage 9 asks the learner to read: four claims at the start and refused charges without the
semaphore, two tracks (a staircase) and no refusal with it."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest
from matplotlib.transforms import Bbox

import reliableq_stages
from reliableq.config import Mechanisms
from reliableq.lab import notebook as nb
from reliableq.lab.chaos import ChaosConfig, run_chaos
from reliableq.lab.lanes import lay_out
from reliableq.lab.scenario import ScenarioParams


@pytest.fixture(autouse=True)
def _figures_closed():
    """The charts drawn here are closed after each test: a figure left open is drawn by the next notebook
    cell or counted by another test."""
    yield
    plt.close("all")


def _texts(figure) -> list[str]:
    return [text.get_text() for text in figure.axes[0].texts]


def _legend(figure) -> list[str]:
    return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]


@pytest.mark.slow
async def test_a_stranded_claim_is_drawn_to_the_end_of_a_run_in_which_nothing_more_happened():
    params = ScenarioParams(seed=1)
    off = await reliableq_stages.get("leases").scenario(False, params)
    assert off.watched_seconds >= 2 * params.lease_seconds
    figure = nb.plot_timeline(off)
    assert figure.axes[0].get_xlim()[1] >= off.watched_seconds
    assert nb.OPEN_ATTEMPT in _legend(figure)
    assert any(text.startswith("nothing happened for 2.") for text in _texts(figure)), _texts(figure)


async def test_a_run_whose_attempts_all_end_has_no_open_attempt_and_no_quiet_stretch():
    on = await reliableq_stages.get("leases").scenario(True, ScenarioParams(seed=1))
    figure = nb.plot_timeline(on)
    assert nb.OPEN_ATTEMPT not in _legend(figure)
    assert not [text for text in _texts(figure) if text.startswith("nothing happened")]


async def test_stage_9_draws_four_claims_and_refusals_without_the_semaphore_and_a_staircase_with_it():
    stage = reliableq_stages.get("semaphore")
    for on, tracks in ((False, 4), (True, 2)):
        run = await stage.scenario(on, ScenarioParams(seed=1))
        events = run.event_rows()
        figure = nb.plot_timeline(run)
        lanes = [tick.get_text() for tick in figure.axes[0].get_yticklabels()]
        layout = lay_out(events, "worker", lanes)
        assert layout.tracks == {"worker-1": tracks}, on
        first = [e["job"] for e in events if e["kind"] == "claim"][:tracks]
        assert sorted(first) == [f"job-{n}" for n in range(1, tracks + 1)]  # the first claims, one a track
        assert ("charge refused for now (5xx)" in _legend(figure)) is not on
        assert set(_texts(figure)) == {"1", "2", "3", "4"}  # each bar says which job it is
        # ...clear of every marker (drawn before its claim, a number once sat on the finalize marker of the
        # job before it on the track), and with the semaphore on, in its bar's middle
        assert not _numbers_on_markers(figure), on
        for text in figure.axes[0].texts:
            (x, height), job = text.xy, f"job-{text.get_text()}"
            bars = [(a.start, a.end) for a in layout.attempts if (a.job, a.height) == (job, height)]
            assert not on or any(x == (start + end) / 2 for start, end in bars), (job, x, bars)
        # With it, a success and the claim its permit passed to (one commit, a millisecond apart) are drawn
        # side by side: the claims of jobs 3 and 4 once hid under the finalize markers of jobs 1 and 2.
        assert not on or not _markers_hiding_each_other(figure)


def _marker_boxes(figure) -> list[Bbox]:
    """Each event marker's drawn box (one scatter per event)."""
    ax, boxes = figure.axes[0], []
    figure.canvas.draw()
    for points in ax.collections:
        half = math.sqrt(points.get_sizes()[0]) / 2 * figure.dpi / 72
        for x, y in ax.transData.transform(points.get_offsets()):
            boxes.append(Bbox.from_extents(x - half, y - half, x + half, y + half))
    return boxes


def _numbers_on_markers(figure) -> list[str]:
    """The job numbers whose drawn box overlaps a marker's."""
    renderer = figure.canvas.get_renderer()
    markers = _marker_boxes(figure)
    return [text.get_text() for text in figure.axes[0].texts if text.get_text().isdigit()
            and any(text.get_window_extent(renderer).overlaps(marker) for marker in markers)]


def _markers_hiding_each_other(figure) -> list[tuple[Bbox, Bbox]]:
    """Pairs of markers on one track drawn over each other by more than a pixel."""
    boxes = _marker_boxes(figure)
    return [(one, other) for i, one in enumerate(boxes) for other in boxes[i + 1:]
            if abs(one.y0 - other.y0) < 1 and min(one.x1, other.x1) - max(one.x0, other.x0) > 1]


@pytest.mark.slow
async def test_a_chaos_run_is_drawn_job_by_job_with_the_broken_jobs_in_red():
    """Notebook 12's chart: a lane per acknowledged job in submission order, and exactly the jobs an
    invariant names (idempotency off: charged twice) labelled in red."""
    report = await run_chaos(ChaosConfig(seed=1, jobs=60, lease_seconds=0.5,
                                         mechanisms=Mechanisms().without("idempotency")))
    figure = nb.plot_chaos(report)
    ticks = figure.axes[0].get_yticklabels()
    assert [tick.get_text() for tick in ticks] == [f"job-{n}" for n in range(1, report.acknowledged + 1)]
    named = {report.label(v["job_id"]) for check in report.checks if not check.held for v in check.violations}
    assert named and {tick.get_text() for tick in ticks if tick.get_color() == "tab:red"} == named


def test_a_handover_at_one_instant_is_drawn_side_by_side():
    """A success and the claim its permit passed to, recorded at the very same moment (one commit's clock),
    on one track: the finalize marker and the claim's, each moved half the way, touch and do not overlap."""
    def event(seconds: float, kind: str, job: str) -> dict:
        return {"seconds": seconds, "kind": kind, "job": f"job-{job}", "worker": "worker-1", "detail": "succeeded"}
    staircase = [event(0.0, "claim", "1"), event(0.2, "finalize_won", "1"), event(0.2, "claim", "2"),
                 event(0.4, "finalize_won", "2")]
    figure = nb._plot_lanes(staircase, "worker", ["worker-1"], "a handover", "seconds", None, None)
    assert not _markers_hiding_each_other(figure)
    assert set(_texts(figure)) == {"1", "2"} and not _numbers_on_markers(figure)
