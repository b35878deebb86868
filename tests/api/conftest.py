"""Fixtures the API tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from reliableq.api import create_api_app
from reliableq.charge.handler import STANDARD_KINDS
from tests.conftest import serve


@pytest.fixture
async def api(databases) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the real API (all mechanisms on) over the test's queue database."""
    async with serve(create_api_app(databases.queue_url, kinds=STANDARD_KINDS)) as client:
        yield client
