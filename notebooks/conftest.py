"""nbval runs these notebooks in kernels that inherit this environment: their exercise panels write the
starters into a workspace of the test run's own, never the developer's (reliableq/lab/places.py)."""

import os
import tempfile

from reliableq.lab.places import WORKSPACE_VARIABLE

os.environ.setdefault(WORKSPACE_VARIABLE, tempfile.mkdtemp(prefix="reliableq-test-workspace-"))
