"""Where each module of the ``interlock`` package lives in this checkout.

``pyproject.toml`` maps the packages ``interlock.core``, ``interlock.policy``,
``interlock.runners``, ``interlock.kernels`` and ``interlock.plugins`` onto the root folders of
the same short names
(``[tool.setuptools.package-dir]``), so every file has one path. Python finds them through the
editable install's import hook; the tools that read files instead of importing them (mypy,
import-linter) and the tests that copy the package learn the same mapping here, from the same
table, rather than from a second list.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tooling runs on the venv's Python
    raise SystemExit("tools/layout.py needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "interlock"


def _setuptools(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]


def mapped_packages(root: Path = ROOT) -> list[str]:
    """The packages whose folder is not under their parent's (``interlock.policy`` -> policy/)."""
    return sorted(_setuptools(root).get("package-dir", {}))


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Each package of the distribution -> its folder in ``root``, from pyproject.toml.

    A package not named in ``package-dir`` lives under its parent's folder, as setuptools has it.
    """
    setuptools = _setuptools(root)
    mapped = setuptools.get("package-dir", {})
    dirs: dict[str, Path] = {}
    for name in sorted(setuptools["packages"], key=lambda n: n.count(".")):
        if name in mapped:
            dirs[name] = root / mapped[name]
        elif "." in name:
            parent, _, last = name.rpartition(".")
            dirs[name] = dirs[parent] / last
        else:
            dirs[name] = root / name
    return dirs


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Each module (``.py``, or a ``.pyi`` that types an extension module) -> its file."""
    modules: dict[str, Path] = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.iterdir()):
            if path.suffix == ".py":
                name = package if path.stem == "__init__" else f"{package}.{path.stem}"
                modules[name] = path
            elif path.suffix == ".pyi" and not path.with_suffix(".py").exists():
                modules[f"{package}.{path.stem}"] = path
    return modules


def assemble(dest: Path, root: Path = ROOT) -> Path:
    """A copy of the package laid out as an install has it (``dest/interlock/policy/...``),
    with pyproject.toml beside it; returns ``dest``, to put on PYTHONPATH."""
    for package, folder in package_dirs(root).items():
        target = dest.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for path in folder.iterdir():
            if path.is_file() and not path.name.endswith(".pyc"):
                shutil.copy2(path, target / path.name)
    shutil.copy(root / "pyproject.toml", dest)
    return dest
