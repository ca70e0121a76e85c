"""Installing plugins' kernel implementations into the kernel registry.

Kernel specs are data (listed by `policy plugins` without torch); they become
``kernels.KernelImpl`` only here, which the application layer
(``interlock.llm.install_plugin_kernels``) calls before any runner loads, so
neither the policy nor the plugin manager ever imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from interlock.core.env import PLUGINS_STRICT
from interlock.plugins.discovery import summarize
from interlock.plugins.isolation import plugin_code
from interlock.plugins.manager import load_registry
from interlock.plugins.registry import PluginRegistry
from interlock.plugins.settings import PluginError
from interlock.plugins.spec import KernelSpec, load_import_path


@dataclass
class KernelInstall:
    """What an install pass did: implementations added, and plugins whose kernels failed."""

    installed: list[str] = field(default_factory=list)  # "op/backend (plugin)"
    failed: list[str] = field(default_factory=list)  # "op/backend (plugin): why"


def install_plugin_kernels(
    kernel_registry: Any, plugin_registry: PluginRegistry | None = None, *, strict: bool = False
) -> KernelInstall:
    """Register every ok plugin's kernel specs into ``kernel_registry`` (a kernels.KernelRegistry).

    Idempotent: an implementation this plugin already registered is skipped. A
    plugin whose kernels cannot be installed is reported in ``failed`` and its
    other kernels are still tried; with ``strict`` (``INTERLOCK_PLUGINS_STRICT=1``, read
    where the run started) it raises. A kernel
    that does not take its op's parameters (the reference's) is such a failure.
    """
    from interlock.kernels.registry import KernelImpl, KernelSignatureError

    plugin_registry = plugin_registry or load_registry()
    report = KernelInstall()
    for plugin in plugin_registry.plugins:
        if plugin.status != "ok":
            continue
        for spec in plugin.kernels:
            label = f"{spec.op}/{spec.backend} ({plugin.name})"
            try:
                if _already_installed(kernel_registry, spec, plugin.name):
                    continue
                # Loaded now so that a wrong path is this plugin's failure,
                # not a surprise in the middle of a run.
                with plugin_code():
                    target = load_import_path(spec.target)
                    unavailable = load_import_path(spec.unavailable) if spec.unavailable else None
                kernel_registry.register(
                    KernelImpl(
                        op=spec.op,
                        backend=spec.backend,
                        target=target,
                        platforms=frozenset(spec.platforms),
                        dtypes=frozenset(spec.dtypes),
                        provider=plugin.name,
                        unavailable=unavailable,
                    )
                )
            except Exception as exc:  # quarantine, as for every plugin failure
                # A signature error cites the plugin's function and its line itself, where
                # summarize would cite the registry's line that raised it.
                why = (f"{type(exc).__name__}: {exc}" if isinstance(exc, KernelSignatureError)
                       else summarize(exc))
                if strict:
                    raise PluginError(
                        f"{PLUGINS_STRICT.name}=1: plugin {plugin.provider}: kernel {label}: {why}"
                    ) from exc
                report.failed.append(f"{label}: {why}")
                continue
            report.installed.append(label)
    return report


def _already_installed(kernel_registry: Any, spec: KernelSpec, provider: str) -> bool:
    # implementations() raises KernelError for an op the registry does not know,
    # which is the right message for a plugin naming a wrong op.
    return any(
        impl.backend == spec.backend and impl.provider == provider
        for impl in kernel_registry.implementations(spec.op)
    )
