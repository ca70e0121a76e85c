"""Creating the runner a decision names, through the plugin that registers it, and putting
the plugins' kernels in place before any runner loads."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from interlock.runners.contract import Runner

if TYPE_CHECKING:
    from interlock.core.env import Settings
    from interlock.plugins.kernels import KernelInstall
    from interlock.plugins.registry import PluginRegistry

LOG = logging.getLogger("interlock")


def install_plugin_kernels(
    plugins: PluginRegistry | None = None, settings: Settings | None = None
) -> KernelInstall:
    """Put every ok plugin's kernel implementations into ``kernels.REGISTRY``, before any
    runner (built-in or a plugin's) builds its kernel table, so each of them can dispatch
    to them and ``INTERLOCK_KERNELS`` can name their backends. Idempotent. A kernel that
    cannot be installed is logged as a warning and left out (its plugin's other kernels
    still install); with ``INTERLOCK_PLUGINS_STRICT=1`` it raises ``PluginError``.
    ``plugins`` and ``settings``: those of the run (``LLM``'s), read where it started; by
    default this call is where they are read."""
    from interlock.core.env import Settings
    from interlock.kernels import REGISTRY
    from interlock.plugins.kernels import install_plugin_kernels as install

    settings = settings or Settings.read()
    report = install(REGISTRY, plugins, strict=settings.plugins_strict)
    for failure in report.failed:
        LOG.warning("plugin kernel not installed: %s", failure)
    return report


def runner_factory(name: str, plugins: PluginRegistry | None = None) -> str:
    """The import path of runner ``name``'s factory, from the plugin that registers it (in
    ``plugins``, the run's registry; default: this process's); an unknown or ambiguous name
    is a ``plugins.PluginError`` saying why."""
    from interlock.plugins import load_registry

    return (plugins or load_registry()).runner(name).spec.factory


def runner_from_plugin(name: str, plugins: PluginRegistry | None = None) -> Runner:
    """A fresh runner object from the plugin that registers runner ``name`` (its spec's
    factory; ``plugins``: as for :func:`runner_factory`); an unknown or ambiguous name is a
    ``interlock.plugins.PluginError`` saying why."""
    from interlock.plugins import PluginError, load_import_path, load_registry
    from interlock.plugins.discovery import summarize
    from interlock.plugins.isolation import plugin_code

    registered = (plugins or load_registry()).runner(name)
    try:
        with plugin_code():
            runner = load_import_path(registered.spec.factory)()
    except Exception as exc:  # the plugin's code: quarantined for this run, with its line
        raise PluginError(
            f"runner {name!r} cannot be created: its factory {registered.spec.factory} (plugin "
            f"{registered.plugin.provider}) failed: {summarize(exc)}; choose another runner "
            f"(--set runner=...) or fix or disable the plugin"
        ) from exc
    if not isinstance(runner, Runner):
        raise PluginError(
            f"runner {name!r}: {registered.spec.factory} (plugin {registered.plugin.provider}) "
            f"built a {type(runner).__name__}, which does not implement "
            "interlock.runners.contract.Runner (load, execute, report)"
        )
    from interlock.plugins.registry import BUILTIN_DISTRIBUTION

    if registered.plugin.distribution == BUILTIN_DISTRIBUTION:
        return runner
    from interlock.app.plugin_runner import PluginRunner

    return PluginRunner(runner, name, registered.plugin.provider)
