"""Where a timeline draws each attempt and event: the attempts of one lane that overlap in time each on a
track of its own, so that four jobs claimed at one instant are four bars and four claims, not one.

An attempt runs from its claim to its finalize (won or refused) or its lease's expiry, or past the run's
end when it had neither. In its lane it takes the lowest track free at its claim (one whose last attempt
ended at or before it), so a worker's lane has as many tracks as it ever held jobs at once. An event of
an attempt (its claim, its end, a fault met during it) is drawn on the attempt's track; a charge request
at the height of the attempt that sent it; any other event at its lane's middle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENDS = ("finalize_won", "finalize_lost", "lease_expired")
SPREAD = 0.6  # of a lane's height, at most, between its lowest and its highest track


@dataclass
class Attempt:
    lane: str
    job: str
    start: float
    end: float | None = None  # None: neither finished nor expired while the run was watched
    track: int = 0
    height: float = 0.0  # its lane's index, plus its track's offset


@dataclass(frozen=True)
class Layout:
    attempts: list[Attempt]  # in claim order
    tracks: dict[str, int]  # lane -> its number of tracks (lanes without attempts have none)
    heights: list[float]  # each event's height, in the order given: its attempt's, or its lane's index


def lay_out(events: list[dict[str, Any]], lane_of: str, lanes: list[str]) -> Layout:
    """The attempts of `events` (in time order; each names its worker and job, and `lane_of` says which
    of the two is its lane) on their tracks, and the height of each event."""
    attempts: list[Attempt] = []
    running: dict[tuple[str, str], Attempt] = {}  # (worker, job) -> its attempt not ended yet
    latest: dict[str, Attempt] = {}  # job -> its attempt claimed last
    owners: list[Attempt | None] = []
    for e in events:
        key = (e["worker"], e["job"])
        if e["kind"] == "claim":
            owner = running[key] = latest[e["job"]] = Attempt(e[lane_of], e["job"], e["seconds"])
            attempts.append(owner)
        elif e["kind"] in ENDS:
            owner = running.pop(key, None)
            if owner is not None:
                owner.end = e["seconds"]
        elif e["kind"] == "charge":
            owner = latest.get(e["job"])
        else:
            owner = running.get(key)
        owners.append(owner)
    tracks = _assign_tracks(attempts)
    widest = max(tracks.values(), default=1)
    row = {lane: i for i, lane in enumerate(lanes)}
    for attempt in attempts:
        attempt.height = row[attempt.lane] + offset(attempt.track, tracks[attempt.lane])
    heights = []
    for e, owner in zip(events, owners, strict=True):
        lane = e[lane_of]
        if owner is None:
            heights.append(float(row[lane]))
        elif lane == owner.lane:
            heights.append(owner.height)
        else:  # in another lane (a charge in the charge service's), on a track of the widest lane's
            heights.append(row[lane] + offset(owner.track, widest))
    return Layout(attempts, tracks, heights)


def offset(track: int, tracks: int) -> float:
    """A track's height within its lane, from the lane's middle: the first lowest."""
    if tracks <= 1:
        return 0.0
    spread = min(SPREAD, 0.2 * (tracks - 1))
    return spread * (track / (tracks - 1) - 0.5)


def _assign_tracks(attempts: list[Attempt]) -> dict[str, int]:
    ends: dict[str, list[float | None]] = {}  # lane -> each track's last attempt's end (None: never ends)
    last_track: dict[tuple[str, str], int] = {}  # (lane, job) -> the track of the job's last attempt there
    for attempt in attempts:
        lane_ends = ends.setdefault(attempt.lane, [])
        free = [i for i, end in enumerate(lane_ends) if end is not None and end <= attempt.start]
        # A job's retries stay on its track while it is free: a row per job where the lane allows it.
        track = last_track.get((attempt.lane, attempt.job))
        if track not in free:
            track = free[0] if free else len(lane_ends)
        if track == len(lane_ends):
            lane_ends.append(None)
        attempt.track, lane_ends[track] = track, attempt.end
        last_track[(attempt.lane, attempt.job)] = track
    return {lane: len(lane_ends) for lane, lane_ends in ends.items()}
