"""Bearer tokens: whether a request's Authorization header carries the one a server requires.

The API and a worker's /metrics server check the same way. This module does not issue or store tokens."""

from __future__ import annotations

import secrets


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether `authorization` is exactly `Bearer <token>`, compared in constant time."""
    # Bytes, not str: compare_digest refuses non-ASCII strings, and a stranger's header may hold any.
    supplied = (authorization or "").encode("utf-8", "replace")
    return secrets.compare_digest(supplied, f"Bearer {token}".encode())
