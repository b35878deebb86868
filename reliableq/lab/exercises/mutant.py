"""What a mutant is: one edit an operator found in a reference's tree, and the file it makes. Shared by
the operators (mutants_sql.py, mutants_python.py) and the harness that grades their mutants (mutants.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Edit:
    """One edit an operator found in a tree, not yet made."""
    operator: str
    description: str
    apply: Callable[[], None]  # makes it, in place, in the tree it was found in


@dataclass(frozen=True)
class Mutant:
    operator: str
    description: str  # unique within its exercise: the key of EQUIVALENT
    text: str  # the whole file, as a learner would have written it
