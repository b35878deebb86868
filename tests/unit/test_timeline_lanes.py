"""Where a timeline draws attempts (reliableq/lab/lanes.py): attempts of one lane that overlap each get a
track, a job's retries keep its track while it is free, a claim held to the end never gives its track
back, and a charge request is drawn at the height of the attempt that sent it."""

from __future__ import annotations

from reliableq.lab.lanes import lay_out, offset

LANES = ["worker-1", "charge-service"]


def _event(seconds: float, kind: str, job: str, worker: str = "worker-1", detail: str = "") -> dict:
    return {"seconds": seconds, "kind": kind, "job": f"job-{job}", "worker": worker, "detail": detail}


def test_claims_at_one_instant_are_as_many_tracks_and_a_staircase_reuses_them():
    burst = [_event(0.0, "claim", n) for n in "1234"] + [_event(0.2, "finalize_won", n) for n in "1234"]
    layout = lay_out(burst, "worker", LANES)
    assert layout.tracks == {"worker-1": 4}
    assert sorted(a.track for a in layout.attempts) == [0, 1, 2, 3]
    assert len({round(h, 6) for h in layout.heights}) == 4  # four claims, each at a height of its own

    # Two permits: jobs 3 and 4 are claimed as 1 and 2 finish (at the same instant), on their tracks.
    staircase = [_event(0.0, "claim", "1"), _event(0.0, "claim", "2"), _event(0.2, "finalize_won", "1"),
                 _event(0.2, "claim", "3"), _event(0.21, "finalize_won", "2"), _event(0.21, "claim", "4"),
                 _event(0.4, "finalize_won", "3"), _event(0.41, "finalize_won", "4")]
    layout = lay_out(staircase, "worker", LANES)
    assert layout.tracks == {"worker-1": 2}
    assert [(a.job, a.track) for a in layout.attempts] == [("job-1", 0), ("job-2", 1), ("job-3", 0), ("job-4", 1)]


def test_a_jobs_retry_keeps_its_track_while_free_and_an_open_claim_keeps_its_own():
    events = [_event(0.0, "claim", "1"), _event(0.0, "claim", "2"), _event(0.1, "finalize_won", "1"),
              _event(0.1, "finalize_won", "2"), _event(0.3, "claim", "2"), _event(0.35, "claim", "1"),
              _event(0.36, "claim", "3")]  # 1 and 2 retried (2 first); 3 finds no track free
    layout = lay_out(events, "worker", LANES)
    assert [(a.job, a.track) for a in layout.attempts] == [
        ("job-1", 0), ("job-2", 1), ("job-2", 1), ("job-1", 0), ("job-3", 2)]
    assert [a.end for a in layout.attempts[2:]] == [None, None, None]  # never ended: held to the run's end


def test_a_charge_is_drawn_at_the_height_of_the_attempt_that_sent_it():
    events = [_event(0.0, "claim", "1"), _event(0.0, "claim", "2"),
              _event(0.05, "charge", "2", "charge-service", "overloaded (503)"),
              _event(0.06, "charge", "1", "charge-service", "created (201)")]
    layout = lay_out(events, "worker", LANES)
    assert layout.heights[2] == 1 + offset(1, 2) and layout.heights[3] == 1 + offset(0, 2)


def test_tracks_spread_within_a_lane_and_one_track_sits_in_the_middle():
    assert offset(0, 1) == 0.0
    heights = [offset(track, 8) for track in range(8)]
    assert heights == sorted(heights) and heights[0] == -heights[-1] and heights[-1] - heights[0] <= 0.6
