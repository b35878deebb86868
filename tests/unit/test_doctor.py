"""What `reliableq doctor` checks without a database: the modules it imports are the lab's, and the Python
it asks for is pyproject's."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from reliableq.cli.doctor import LAB_MODULES, minimum_python, required_python

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]


def test_the_modules_checked_are_psycopg_and_the_lab_extra():
    """A package added to the lab extra is checked too (each of its names imports under the same name)."""
    lab = {re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
           for requirement in PYPROJECT["optional-dependencies"]["lab"]}
    assert set(LAB_MODULES) == lab | {"psycopg"}


def test_the_python_asked_for_is_the_lower_bound_of_requires_python():
    assert required_python() == PYPROJECT["requires-python"]
    assert minimum_python(">=3.11") == (3, 11)
    assert minimum_python(">= 3.12.1, <4") == (3, 12, 1)
    with pytest.raises(ValueError, match="no lower bound"):
        minimum_python("<4")
