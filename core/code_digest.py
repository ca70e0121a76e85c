"""What code a measurement ran: a digest of each source file of the runners and kernels.

A measurement record keeps these digests (``software.code``), and ``policy check`` compares
them with the files installed now: evidence measured on runner or kernel code that has
changed since is stale, whatever the dates say. The files are found without importing
the packages (``policy check`` never imports torch): by the folders the import system
would load ``interlock.runners`` and ``interlock.kernels`` from.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

#: The packages whose code decides how fast a measured decision runs.
MEASURED_PACKAGES = ("interlock.runners", "interlock.kernels")
#: Source files, by suffix: Python, and the native kernels' C.
SOURCE_SUFFIXES = (".py", ".c", ".h")


def code_files() -> dict[str, Path]:
    """``{"runners/mrv1/runner.py": path, ...}``: each source file of the measured packages,
    named by the package's last component and the path below it."""
    files: dict[str, Path] = {}
    for package in MEASURED_PACKAGES:
        spec = importlib.util.find_spec(package)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            root = Path(folder)
            for path in sorted(root.rglob("*")):
                if path.suffix in SOURCE_SUFFIXES and path.is_file() and (
                    "__pycache__" not in path.parts
                ):
                    files[f"{package.rsplit('.', 1)[1]}/{path.relative_to(root).as_posix()}"] = path
    return files


def code_digests(loaded: bool = False) -> dict[str, str]:
    """The sha256 (first 16 hex digits) of each file :func:`code_files` finds; with
    ``loaded``, only the files of the modules this process imported (what a measurement
    ran), and the C sources of a package whose extension it loaded."""
    files = code_files()
    if loaded:
        import sys

        ran = {
            Path(file).resolve()
            for name, module in list(sys.modules.items())
            if name.startswith(MEASURED_PACKAGES)
            and (file := getattr(module, "__file__", None)) is not None
        }
        native = {p.parent for p in ran if p.suffix not in (".py",)}  # compiled extensions
        files = {
            name: path for name, path in files.items()
            if path.resolve() in ran or (path.suffix != ".py" and path.resolve().parent in native)
        }
    return {
        name: hashlib.sha256(path.read_bytes()).hexdigest()[:16] for name, path in files.items()
    }


def changed_code(recorded: dict[str, str]) -> list[str]:
    """The files of ``recorded`` whose digest differs now, or that are gone (a file the
    measurement did not run cannot make it stale)."""
    now = code_digests()
    return sorted(name for name in recorded if recorded[name] != now.get(name))
