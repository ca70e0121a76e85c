"""Runner plugins: the public API for plugin authors and the registry the policy reads.

Plugin authors need ``hookimpl`` and the spec models::

    from interlock.plugins import RunnerSpec, PlatformSupport, hookimpl

The host reads ``load_registry()``. Importing this package does not import
pluggy: ``hookimpl``/``hookspec`` load it on first use, so a cached
`policy explain` never pays for it.
"""

from __future__ import annotations

if __name__ == "plugins":  # the checkout root on sys.path: see core/bare_name.py
    from interlock.core.bare_name import hand_over

    hand_over(__name__, __file__)
else:
    from typing import Any

    from interlock.core.decision import CUDAGRAPH_MODES
    from interlock.core.platform import PLATFORM_NAMES
    from interlock.plugins.api import ENTRY_POINT_GROUP, PLUGIN_API_VERSION
    from interlock.plugins.manager import add_plugin, load_registry, remove_plugin, reset
    from interlock.plugins.registry import PluginRecord, PluginRegistry, RegisteredRunner
    from interlock.plugins.settings import PluginError
    from interlock.plugins.spec import (
        KernelSpec,
        PlatformSupport,
        RunnerSpec,
        SpecError,
        Unsupported,
        load_import_path,
    )

    __all__ = [
        "CUDAGRAPH_MODES",
        "ENTRY_POINT_GROUP",
        "PLATFORM_NAMES",
        "PLUGIN_API_VERSION",
        "KernelSpec",
        "PlatformSupport",
        "PluginError",
        "PluginRecord",
        "PluginRegistry",
        "RegisteredRunner",
        "RunnerSpec",
        "SpecError",
        "Unsupported",
        "add_plugin",
        "hookimpl",
        "hookspec",
        "load_import_path",
        "load_registry",
        "remove_plugin",
        "reset",
    ]


    def __getattr__(name: str) -> Any:
        if name in ("hookimpl", "hookspec"):
            from interlock.plugins import hookspecs

            return getattr(hookspecs, name)
        raise AttributeError(f"module 'plugins' has no attribute {name!r}")
