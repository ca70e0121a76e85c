"""One path per file: each module of the package is one git-tracked file, under one name.

The root folders policy/, runners/, kernels/ and plugins/ are the packages interlock.policy, ...
through pyproject.toml's package-dir mapping (no links). Python, mypy (tools/typecheck.py),
import-linter (tools/lint_imports.py) and coverage all read that one mapping.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from checkout import REPO, copy_checkout, layout

BARE = {"core", "kernels", "policy", "plugins", "runners"}


def _git_files() -> set[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return {REPO / name for name in listed.split("\0") if name}


def test_every_module_is_one_tracked_file_without_a_link() -> None:
    tracked = _git_files()
    modules = layout.module_files()
    assert {"interlock.policy.loader", "interlock.kernels.native._cpu"} <= set(modules)
    for name, path in modules.items():
        assert path.resolve() == path, f"{name}: {path} goes through a link"
        assert path in tracked, f"{name}: {path} is not tracked by git"
    links = [p for p in tracked if p.is_symlink()]
    # The links are data, not modules: the shipped policy inside its package is the
    # repository's top-level policies.yaml, @all-releases links to
    # examples/vllm-all-releases.yaml and @sglang to examples/sglang.yaml (the wheel
    # carries them as regular files).
    assert sorted(links) == [REPO / "policy" / "policies.yaml",
                             REPO / "policy" / "sglang.yaml",
                             REPO / "policy" / "vllm-all-releases.yaml"]


def test_python_imports_each_module_from_that_file() -> None:
    for name, path in layout.module_files().items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        origin = Path(spec.origin)
        if path.suffix == ".pyi":  # typed extension module: the built library lies beside it
            assert origin.parent == path.parent and origin.name.startswith(path.stem + "."), name
        else:
            assert origin == path, f"{name}: imported from {origin}, not {path}"


def test_the_acceptance_command_prints_the_tracked_path(tmp_path: Path) -> None:
    code = "import interlock.policy.loader as m; print(m.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        check=True,
    )
    assert done.stdout.strip() == str(REPO / "policy" / "loader.py")


def test_the_wheel_lays_every_module_out_under_its_package(interlock_wheel: Path) -> None:
    with zipfile.ZipFile(interlock_wheel) as wheel:
        names = set(wheel.namelist())
    assert "interlock/py.typed" in names  # the annotations are for users' type checkers too
    for name, path in layout.module_files().items():
        if path.suffix == ".py":
            tail = "/__init__.py" if path.stem == "__init__" else ".py"
            installed = "/".join(name.split(".")) + tail
            assert installed in names, f"{name}: {installed} is not in the wheel"


def test_every_package_folder_is_listed_in_pyproject() -> None:
    dirs = layout.package_dirs()
    for name in [layout.PACKAGE, *layout.mapped_packages()]:
        for init in dirs[name].rglob("__init__.py"):
            assert init.parent in dirs.values(), f"{init.parent}: list it in pyproject's packages"


def test_coverage_measures_the_package_and_each_mapped_folder() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["coverage"]["run"]
    assert config["source_pkgs"] == [layout.PACKAGE, *layout.mapped_packages()]


def test_no_test_imports_a_bare_root_folder() -> None:
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names
                      if n.split(".")[0] in BARE]
    assert found == [], "import these as interlock.<name>"


@pytest.mark.slow
def test_mypy_reports_a_mapped_module_by_its_path(tmp_path: Path) -> None:
    root = copy_checkout(tmp_path / "checkout")
    trace = root / "policy" / "trace.py"
    line = len(trace.read_text().splitlines()) + 1
    trace.write_text(trace.read_text() + 'wrong: int = "not an int"\n')
    done = subprocess.run(
        [sys.executable, str(root / "tools" / "typecheck.py"), "interlock.policy"], cwd=root,
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"policy/trace.py:{line}: error: Incompatible types in assignment" in done.stdout


@pytest.mark.parametrize("cwd", ["root", "elsewhere"])
def test_bare_kernels_is_hugging_faces_package_and_ours_stays_interlock_kernels(
    tmp_path: Path, cwd: str
) -> None:
    """transformers imports Hugging Face's ``kernels``: run in the checkout (its root first on
    sys.path) or anywhere else, ``import kernels`` must find the installed distribution, and
    ``interlock.kernels`` the root folder."""
    installed = importlib.util.find_spec("kernels")
    assert installed is not None, "the test extras install Hugging Face's kernels"
    code = ("import kernels, interlock.kernels, sys; "
            "print(kernels.__file__); print(interlock.kernels.__file__); "
            "print(callable(getattr(kernels, 'get_kernel', None)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO if cwd == "root" else tmp_path,
                         capture_output=True, text=True, check=True).stdout.split()
    assert Path(out[0]).resolve().parent.parent != REPO, out[0]
    assert "site-packages" in out[0] and out[2] == "True"
    assert Path(out[1]) == REPO / "kernels" / "__init__.py"


@pytest.mark.parametrize("name", sorted(BARE - {"kernels"}))
def test_a_bare_root_folder_without_an_installed_namesake_is_not_found(name: str) -> None:
    result = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert f"No module named {name!r}" in result.stderr
    assert f"is interlock.{name}, not a package of that name" in result.stderr
    # What to do about it (issue 52 item 3: vLLM started from the checkout's root died here).
    assert "start the program from another directory" in result.stderr


def test_importing_kernels_in_this_process_is_hugging_faces() -> None:
    """pytest's own process has the root on sys.path (``python -m pytest``): transformers'
    ``from kernels import ...`` must still reach the installed package."""
    kernels = importlib.import_module("kernels")
    assert Path(kernels.__file__).resolve().parent != REPO / "kernels"
