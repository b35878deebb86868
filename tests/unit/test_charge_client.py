"""How the worker's charge client classifies an answer (reliableq/charge/client.py), no service needed."""

from __future__ import annotations

import pytest

from reliableq.charge.client import classify_status


@pytest.mark.parametrize("status, kind", [
    (200, "ok"), (201, "ok"), (408, "transient"), (429, "transient"), (500, "transient"), (503, "transient"),
    (400, "permanent"), (409, "permanent"), (422, "permanent"),
])
def test_status_classification(status, kind):
    """408, 429 and 5xx may succeed later; other 4xx will not."""
    assert classify_status(status) == kind
