"""The lab's stages, in the order the mechanisms are introduced: naive first, then one per flag of
`reliableq.config.Mechanisms`. Each module declares its failure, its invariant and its mechanism and
has the same `scenario(on, params)`; `reliableq.lab.experiment` and `reliableq.lab.scenario` hold what they share.
This folder installs as `reliableq_stages` (pyproject.toml says why), the name every import uses.

    import asyncio, reliableq_stages
    from reliableq.lab.experiment import compare
    from reliableq.lab.scenario import ScenarioParams
    off, on = asyncio.run(compare(reliableq_stages.get("fencing"), ScenarioParams(seed=1)))
    print(off.summary()); print(on.rows())
"""

from __future__ import annotations

from reliableq.lab.experiment import Stage, index_stages

from . import (
    s01_naive,
    s02_commit_before_ack,
    s03_skip_locked,
    s04_leases,
    s05_fencing,
    s06_idempotency,
    s07_backoff,
    s08_dead,
    s09_semaphore,
    s10_sync_standby,
    s11_fairness,
)

STAGES: list[Stage] = [s01_naive, s02_commit_before_ack, s03_skip_locked, s04_leases, s05_fencing,
                           s06_idempotency, s07_backoff, s08_dead, s09_semaphore, s10_sync_standby, s11_fairness]
BY_NAME: dict[str, Stage] = index_stages(STAGES)


def names() -> list[str]:
    return list(BY_NAME)


def get(name: str) -> Stage:
    """The stage called `name` ('skip-locked'; the mechanism's spelling 'skip_locked' works too)."""
    stage = BY_NAME.get(name.strip().lower().replace("_", "-"))
    if stage is None:
        raise LookupError(f"unknown stage {name!r}; expected one of {', '.join(BY_NAME)}")
    return stage
