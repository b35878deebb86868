"""Errors as the queue stores them (reliableq/queue.py's sanitize_error): one line, bounded, no secrets."""

from __future__ import annotations

import pytest

from reliableq.queue import sanitize_error


def test_sanitize_error_strips_secrets_and_bounds_length():
    """Stored errors are one line, bounded, without credentials."""
    text = sanitize_error("failed\r\n postgresql://u:pw@host/db token=abc\x00 " + "y" * 900)
    assert "pw@" not in text and "abc" not in text and "\n" not in text and "\x00" not in text
    assert len(text) == 500 and text.startswith("failed postgresql://u:***@host/db token=***")


@pytest.mark.parametrize("secret", [
    "Authorization: Bearer abc123secret", "api_token=abc123secret", "client_secret=abc123secret",
    "X-Api-Key: abc123secret", '{"password": "abc123secret"}', "postgresql://u:abc@123secret@host/db",
])
def test_sanitize_error_hides_secrets_in_their_usual_spellings(secret):
    """Headers, keyed assignments, JSON fields and URLs with an @ in the password all lose the secret."""
    assert "123secret" not in sanitize_error(f"charge failed: {secret} (retrying)")
