"""The embedded server's own settings (reliableq/db.py EMBEDDED_SETTINGS): a new server gets them and is
restarted once, before any of the processes that started it together connects; a server made by an older
release gets them at its next use, and one that has them is never restarted for them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from reliableq import db

# What each process prints once it has the server: its setting and when the server last started.
SHOW = """
import psycopg
from reliableq import db
with psycopg.connect(db.server_url()) as conn:
    print(*conn.execute("SELECT current_setting('max_connections'), pg_postmaster_start_time()").fetchone())
"""
LINE = "max_connections = 300  # reliableq/db.py"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")),
                                 reason="DATABASE_URL names the server: no embedded one is started")]


def test_a_new_server_has_the_settings_and_an_older_one_gets_them_once(tmp_path):
    data_dir = tmp_path / "pg18"
    env = os.environ | {"RELIABLEQ_DATA_DIR": str(data_dir)}

    def started_together(count: int) -> list[tuple[str, str]]:
        processes = [subprocess.Popen([sys.executable, "-c", SHOW], env=env, stdout=subprocess.PIPE, text=True)
                     for _ in range(count)]
        return [tuple(process.communicate(timeout=120)[0].split(" ", 1)) for process in processes]

    assert db.EMBEDDED_SETTINGS == {"max_connections": "300"}
    try:
        first = started_together(4)
        assert {setting for setting, _ in first} == {"300"}
        assert len({start for _, start in first}) == 1  # all four connected after the one restart
        conf = data_dir / "postgresql.conf"
        assert conf.read_text().count(LINE) == 1
        assert started_together(1) == first[:1]  # settings in place: not restarted again

        conf.write_text(conf.read_text().replace(LINE + "\n", ""))  # as an older release left it
        (setting, restarted_at), = started_together(1)
        assert setting == "300" and restarted_at != first[0][1]
        assert conf.read_text().count(LINE) == 1
    finally:
        subprocess.run([sys.executable, "-m", "reliableq", "db", "stop"], env=env, capture_output=True, timeout=60)
