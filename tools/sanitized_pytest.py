"""Runs pytest with the native kernels replaced by a sanitizer build of the kernels.

``make sanitize`` compiles the C files of kernels/native/ with AddressSanitizer and UBSan into
build/sanitize/ and runs the native kernel tests through this script, under
``LD_PRELOAD`` of the ASan runtime (Python itself is not instrumented). The build is
loaded as ``interlock.kernels.native._cpu`` before anything imports the real one, so the
installed extension is untouched and every test sees only the sanitized kernels.

    python tools/sanitized_pytest.py SO_PATH [pytest args...]
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 1:
        print(__doc__, file=sys.stderr)
        return 2
    name = "interlock.kernels.native._cpu"
    loader = importlib.machinery.ExtensionFileLoader(name, argv[0])
    spec = importlib.util.spec_from_file_location(name, argv[0], loader=loader)
    if spec is None:
        print(f"sanitize: cannot load {argv[0]}", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[name] = module
    import pytest

    # The tests must really be running the sanitized build, not a re-imported one.
    code = pytest.main(argv[1:])
    if sys.modules.get(name) is not module:
        print("sanitize: the native module was replaced during the run", file=sys.stderr)
        return 3
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
