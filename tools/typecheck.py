"""mypy over this checkout, each module under its one importable name.

mypy names a file by the folders above it (``policy/loader.py`` would be ``policy.loader``) and
does not run the editable install's import hook, so it cannot find ``interlock.policy`` in the
root folder ``policy/``. Links would give every file a second path; instead this hands mypy
each file with its module name from pyproject.toml's mapping (tools/layout.py), and mypy's
configuration ([tool.mypy]) applies unchanged.

    python tools/typecheck.py [MODULE_PREFIX ...]

reports the errors of the modules under the given prefixes (default: the whole package); every
module of the package is analysed, so imports between them resolve. Exit status 1 on errors.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from layout import PACKAGE, ROOT, module_files
from mypy import build
from mypy.errors import CompileError
from mypy.fscache import FileSystemCache
from mypy.main import process_options
from mypy.modulefinder import BuildSource


def main(argv: list[str]) -> int:
    started = time.monotonic()
    prefixes = tuple(argv) or (PACKAGE,)
    modules = module_files()
    fscache = FileSystemCache()
    # Files on the command line: mypy reads [tool.mypy] for its options, and no targets from it.
    _, options = process_options(
        ["--config-file", str(ROOT / "pyproject.toml"), *map(str, modules.values())],
        fscache=fscache,
    )
    sources = [BuildSource(str(path), name, None) for name, path in modules.items()]
    reported = {
        str(path) for name, path in modules.items()
        if any(name == p or name.startswith(p + ".") for p in prefixes)
    }
    try:
        messages = build.build(sources, options, fscache=fscache).errors
    except CompileError as error:
        messages = error.messages
    relative = {str(path): str(path.relative_to(ROOT)) for path in modules.values()}
    shown = []
    for message in messages:
        path, sep, rest = message.partition(":")
        path = str((Path.cwd() / path).resolve())  # mypy writes paths relative to the cwd
        if path in relative and path not in reported:
            continue
        shown.append(relative.get(path, path) + sep + rest)
    for line in shown:
        print(line)
    errors = sum(": error:" in line for line in shown)
    checked = len(reported)
    elapsed = time.monotonic() - started
    if errors:
        print(f"Found {errors} errors in {checked} checked source files ({elapsed:.0f} s)")
        return 1
    print(f"Success: no issues found in {checked} source files ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
