"""What the distribution installs. The wheel's top-level packages are exactly `reliableq` and
`reliableq_stages` (the repository's `stages/` folder, under a name no other distribution would install),
and an editable install exposes the same two names, live from the checkout, and not the checkout's root
(which would make `stages`, `tests`, ... importable from anywhere). The wheels are built here by the build
backend's own PEP 517 hooks, as pip calls them (a fraction of a second each); each is then imported by a
fresh interpreter, in a folder outside the checkout, that sees it as an installed distribution."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from hatchling.build import build_editable, build_wheel

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = {"reliableq", "reliableq_stages"}
# What the wheel adds beside its packages: the metadata, and the data folder (JupyterLab's lab settings).
NOT_PACKAGES = re.compile(r".+-[^-]+\.(dist-info|data)$")


def _build(build, out: Path, monkeypatch) -> zipfile.ZipFile:
    monkeypatch.chdir(ROOT)  # the hooks take the project from the working directory, as under pip
    out.mkdir()
    return zipfile.ZipFile(out / build(str(out)))


@pytest.fixture
def wheel(tmp_path, monkeypatch) -> zipfile.ZipFile:
    return _build(build_wheel, tmp_path / "wheel", monkeypatch)


@pytest.fixture
def editable(tmp_path, monkeypatch) -> zipfile.ZipFile:
    return _build(build_editable, tmp_path / "editable", monkeypatch)


def _top_level(archive: zipfile.ZipFile) -> set[str]:
    return {name.split("/")[0] for name in archive.namelist()} - {
        name.split("/")[0] for name in archive.namelist() if NOT_PACKAGES.match(name.split("/")[0])}


def _run_installed(site: Path, code: str, cwd: Path) -> dict:
    """Run `code` in a fresh interpreter whose only site folder is `site` (its .pth files processed, as at
    start-up), from `cwd`, and this environment's site-packages for the dependencies without its .pth files
    (that is, without this environment's own install of reliableq). `code` sets `out`."""
    packages = sysconfig.get_paths()["purelib"]
    # `site` first, so that its modules are found before this environment's (whose own editable install has
    # bootstraps of the same names); the dependencies before its .pth files run (a bootstrap imports editables).
    program = (f"import json, site, sys\nsys.path += [{str(site)!r}, {packages!r}]\nsite.addsitedir({str(site)!r})\n"
               f"{code}\nprint(json.dumps(out))")
    done = subprocess.run([sys.executable, "-S", "-c", program], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


IMPORTS = """
import importlib.util
import reliableq, reliableq_stages
out = {"reliableq": reliableq.__file__, "reliableq_stages": reliableq_stages.__file__,
       "fencing": reliableq_stages.get("fencing").__name__,
       "elsewhere": [name for name in ("stages", "tests", "notebooks") if importlib.util.find_spec(name)]}
"""


def _imported_from(archive: zipfile.ZipFile, site: Path) -> tuple[Path, Path]:
    """Install `archive` by extracting it into `site` and import from there in a fresh interpreter, outside
    the checkout; check what any install must give (the stages by their installed name, none of the
    checkout's folders importable) and return the folders `reliableq` and `reliableq_stages` came from."""
    archive.extractall(site)
    out = _run_installed(site, IMPORTS, cwd=site.parent)
    assert (out["fencing"], out["elsewhere"]) == ("reliableq_stages.s05_fencing", [])
    return Path(out["reliableq"]).parent, Path(out["reliableq_stages"]).parent


def test_the_wheel_installs_reliableq_and_the_stages_as_reliableq_stages(wheel):
    """Exactly the two packages at the top, no `stages`; the stages package holds the folder's modules."""
    assert _top_level(wheel) == INSTALLED
    shipped = {name.removeprefix("reliableq_stages/") for name in wheel.namelist()
               if name.startswith("reliableq_stages/")}
    assert shipped == {path.name for path in (ROOT / "stages").glob("*.py")}


def test_the_wheels_stages_import_by_their_installed_name(wheel, tmp_path):
    site = tmp_path / "site"
    assert _imported_from(wheel, site) == (site / "reliableq", site / "reliableq_stages")


def test_an_editable_install_maps_the_two_names_to_the_checkout_and_nothing_else(editable, tmp_path):
    """Only import hooks at the top (no folder is copied, no directory put on sys.path), and through them
    `reliableq` and `reliableq_stages` are the checkout's own files, while `stages` is not importable."""
    files = _top_level(editable)
    assert files == {"_editable_impl_reliableq.pth", "_editable_impl_reliableq.py",
                     "_editable_impl_reliableq_stages.pth", "_editable_impl_reliableq_stages.py"}
    for pth in (name for name in files if name.endswith(".pth")):
        assert all(line.startswith("import ") for line in editable.read(pth).decode().splitlines())
    assert _imported_from(editable, tmp_path / "site") == (ROOT / "reliableq", ROOT / "stages")


def _sources() -> dict[str, str]:
    """Every Python source of the repository, notebooks' code cells included."""
    found = {str(path.relative_to(ROOT)): path.read_text() for folder in ("reliableq", "stages", "tests")
             for path in (ROOT / folder).rglob("*.py")}
    found["hatch_build.py"] = (ROOT / "hatch_build.py").read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        found[str(path.relative_to(ROOT))] = "\n".join("".join(c["source"]) for c in cells
                                                        if c["cell_type"] == "code")
    return found


def test_no_code_imports_the_stages_by_their_folders_name():
    """`import stages` works only with the checkout's root on the path (its current directory, or pytest's
    rootdir); installed, the stages are `reliableq_stages`, and every import says so."""
    old = re.compile(r"^\s*(import|from)\s+stages\b", re.MULTILINE)
    sources = _sources()
    assert len(sources) > 100 and any(name.endswith(".ipynb") for name in sources)
    assert [name for name, text in sources.items() if old.search(text)] == []
