"""The tiny profile's scenarios in two runs, one test each, so that xdist gives each a test process of its
own: all in one run took up to 300 s beside the rest of the suite in CI. Together they are every scenario,
each once."""

from __future__ import annotations

from reliableq.bench.fairness import QUIET_TENANT
from reliableq.bench.scenarios import SCENARIOS

# The standby's servers, the fair claim's backlogs, the pickup timings and the profiled processes.
SECOND_RUN = ("standby", "fairness", QUIET_TENANT, "client-cost", "pickup")
FIRST_RUN = tuple(name for name in SCENARIOS if name not in SECOND_RUN)
