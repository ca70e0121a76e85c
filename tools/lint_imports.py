"""``lint-imports`` over this checkout: the contracts of pyproject.toml, one path per module.

grimp finds a package's modules by walking the folder of its ``__init__.py``; here
``interlock.policy`` (and the other mapped packages) live in root folders, not under
``interlock/``. This adds each mapped package as a root of the graph at its real folder, then
runs import-linter's own command unchanged (same options, output and exit codes). An installed
copy, where everything is under ``interlock/``, needs only plain ``lint-imports``.
"""

from __future__ import annotations

import sys
from typing import Any

import grimp
from grimp.application.config import settings as grimp_settings
from importlinter import cli
from importlinter.application.app_config import settings
from layout import mapped_packages, package_dirs

DIRS = package_dirs()


class MappedPackageFinder:
    """grimp's package finder, answering from pyproject.toml's mapping instead of importlib."""

    def determine_package_directories(self, package_name: str, file_system: Any) -> set[str]:
        return {str(DIRS[package_name])}


class MappedGraphBuilder:
    """import-linter's graph builder, with the mapped packages added as roots of the graph."""

    def build(
        self,
        root_package_names: list[str],
        cache_dir: str | None,
        include_external_packages: bool = False,
        exclude_type_checking_imports: bool = False,
    ) -> grimp.ImportGraph:
        roots = list(root_package_names)
        roots += [
            name for name in mapped_packages()
            if name not in roots and any(name.startswith(root + ".") for root in roots)
        ]
        return grimp.build_graph(
            *roots,
            include_external_packages=include_external_packages,
            exclude_type_checking_imports=exclude_type_checking_imports,
            cache_dir=cache_dir,
        )


grimp_settings.configure(PACKAGE_FINDER=MappedPackageFinder())
settings.configure(GRAPH_BUILDER=MappedGraphBuilder())

if __name__ == "__main__":
    sys.exit(cli.lint_imports_command())
