"""Hatchling build hook (pyproject.toml `[tool.hatch.build.targets.wheel.hooks.custom]`): an editable
install exposes the repository's `stages/` folder as `reliableq_stages`, the name the wheel installs it
under, live from the checkout; and it copies nothing into site-packages.

A wheel renames the folder with `force-include` ("stages" = "reliableq_stages"). An editable build cannot
rename it by itself: hatchling's `sources` rewriting refuses dev mode when it changes a prefix, and its
forced inclusions are copied into the editable wheel (a stale copy of the stages, found before the
checkout). So, for editable builds only, this hook replaces the forced inclusions with the same import hook
that `dev-mode-exact` writes for `reliableq` (editables' redirector, mapping one top-level name to one
folder), here mapping `reliableq_stages` to `stages/`. Replacing them also drops the copy of `sql/` into
site-packages' `reliableq/sql`: unread in an editable install (reliableq/sql.py falls back to the
checkout's `sql/`), and with `dev-mode-exact` it would make `reliableq` import as an empty namespace
package, since the path finder runs before the redirector.

Regular (wheel) builds are left as pyproject.toml configures them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

FOLDER = "stages"  # in the repository
INSTALLED_AS = "reliableq_stages"


class EditableStagesHook(BuildHookInterface):
    _generated: str | None = None

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version != "editable":
            return
        # hatchling requires editables for every editable build (and the editable wheel at run time).
        from editables import EditableProject

        project = EditableProject(INSTALLED_AS, self.root)
        project.map(INSTALLED_AS, FOLDER)
        self._generated = tempfile.mkdtemp(prefix="reliableq-editable-")
        for name, content in project.files():  # a .pth that imports a bootstrap module, and that module
            path = os.path.join(self._generated, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(content)
            build_data["force_include_editable"][path] = name

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._generated is not None:
            shutil.rmtree(self._generated, ignore_errors=True)
            self._generated = None
