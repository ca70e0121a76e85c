"""The root folders under their bare names: ``import kernels`` is never interlock's.

``core/``, ``kernels/``, ``policy/``, ``plugins/`` and ``runners/`` are the packages
``interlock.core``, ``interlock.kernels``, ... (pyproject.toml's package-dir). Whenever the
checkout's root is on ``sys.path`` (``python -c`` or ``python -m pytest`` run there, a script
beside it), Python finds those folders under their bare names first, ahead of site-packages, and
Hugging Face's ``kernels`` (which transformers imports) would be shadowed by ours. So each root
package's ``__init__`` calls :func:`hand_over` first when it runs under its bare name: the
import then yields the installed distribution of that name, or fails as if the folder were not
there.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def _outside(path: str, root: Path) -> bool:
    try:
        return Path(path or ".").resolve() != root
    except OSError:  # an unreadable sys.path entry cannot be the checkout
        return True


def hand_over(name: str, init_file: str) -> None:
    """Replace ``sys.modules[name]`` (this root folder, imported by its bare name) with the
    package of that name found anywhere but the checkout's root."""
    root = Path(init_file).resolve().parent.parent
    search = [entry for entry in sys.path if _outside(entry, root)]
    spec = None
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = importlib.machinery.PathFinder.find_spec(name, search)
        elif hasattr(finder, "find_spec"):
            spec = finder.find_spec(name, None)
            if spec is not None and spec.origin and Path(spec.origin).resolve().is_relative_to(
                root / name
            ):
                spec = None
        if spec is not None:
            break
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(
            f"No module named {name!r} (the folder {root / name} is interlock.{name}, "
            f"not a package of that name; it was found because interlock's checkout {root} "
            f"is on sys.path, as the current directory of `python -m` or `python -c`: start "
            f"the program from another directory, e.g. `cd /tmp`)",
            name=name,
        )
    module = importlib.util.module_from_spec(spec)
    # The import statement returns what sys.modules holds once this __init__ has run.
    sys.modules[name] = module
    spec.loader.exec_module(module)
