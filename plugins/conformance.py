"""The conformance checks a runner plugin runs against itself (see ``plugins.testing``).

Each check returns findings (empty when the plugin conforms), so the same
checks serve pytest, a CI script or an interactive session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plugins.discovery import PluginSource, Settings, discover, summarize
from plugins.registry import PluginRecord, PluginRegistry
from plugins.spec import load_import_path


@dataclass(frozen=True)
class Finding:
    check: str
    subject: str  # the runner or kernel concerned, or the plugin
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.subject}: {self.message}"


def load_for_conformance(plugin: object, name: str) -> PluginRecord:
    """Load ``plugin`` alone, exactly as discovery loads an installed one."""
    source = PluginSource(name, "under-test", "0", f"conformance {name}", lambda: plugin)
    return discover([source], Settings()).registry.plugins[0]


def check_loads(record: PluginRecord, installed: PluginRegistry) -> list[Finding]:
    """The plugin loads, is API-compatible, declares something, and clashes with nobody."""
    if record.status != "ok":
        return [Finding("loads", record.name, record.status_line)]
    found = []
    if not record.runners and not record.kernels:
        found.append(Finding("loads", record.name, "declares no runner and no kernel"))
    names = [spec.name for spec in record.runners]
    for name in sorted({n for n in names if names.count(n) > 1}):
        found.append(Finding("loads", name, "declared twice by this plugin"))
    for spec in record.runners:
        other = installed.find(spec.name)
        if other is not None and other.spec != spec:
            found.append(Finding("loads", spec.name, f"also registered by {other.plugin.provider}"))
    return found


def check_capabilities(record: PluginRecord, installed: PluginRegistry) -> list[Finding]:
    """Declarations agree with each other: fallbacks exist and end, conditions are not vacuous."""
    known = {reg.spec.name: reg.spec for reg in installed.runners()}
    known.update({spec.name: spec for spec in record.runners})
    found = []
    for spec in record.runners:
        chain = [spec.name]
        current = spec
        while current.fallback is not None:
            if current.fallback in chain:
                found.append(
                    Finding(
                        "capabilities",
                        spec.name,
                        "fallback chain loops: " + " -> ".join([*chain, current.fallback]),
                    )
                )
                break
            chain.append(current.fallback)
            if current.fallback not in known:
                found.append(
                    Finding(
                        "capabilities",
                        spec.name,
                        f"falls back to {current.fallback!r}, which is not registered",
                    )
                )
                break
            current = known[current.fallback]
        for i, item in enumerate(spec.unsupported):
            platforms = item.when.get("platform")
            if set(item.when) == {"platform"}:
                found.append(
                    Finding(
                        "capabilities",
                        spec.name,
                        f"unsupported[{i}] ({item.feature}) excludes whole platforms "
                        f"{platforms!r}: leave them out of `platforms` instead",
                    )
                )
    return found


def check_factories(record: PluginRecord) -> list[Finding]:
    """Every runner's factory imports and is callable (a class, or a function building one)."""
    found = []
    for spec in record.runners:
        try:
            factory = load_import_path(spec.factory)
        except Exception as exc:
            found.append(
                Finding("factory", spec.name, f"{spec.factory} is not importable: {summarize(exc)}")
            )
            continue
        if not callable(factory):
            found.append(
                Finding(
                    "factory",
                    spec.name,
                    f"{spec.factory} is a {type(factory).__name__}, not callable",
                )
            )
    return found


def check_kernels(record: PluginRecord) -> list[Finding]:
    """Kernel specs name known ops and importable functions (imports kernels, hence torch)."""
    from kernels import REGISTRY

    found = []
    for spec in record.kernels:
        subject = f"{spec.op}/{spec.backend}"
        if spec.op not in REGISTRY.ops():
            found.append(
                Finding(
                    "kernels", subject, f"unknown op {spec.op!r}; ops: {', '.join(REGISTRY.ops())}"
                )
            )
        for path in filter(None, (spec.target, spec.unavailable)):
            try:
                obj = load_import_path(path)
            except Exception as exc:
                found.append(
                    Finding("kernels", subject, f"{path} is not importable: {summarize(exc)}")
                )
                continue
            if not callable(obj):
                found.append(Finding("kernels", subject, f"{path} is not callable"))
    return found


# Checks that execute the runner belong here; they need runners that run
# models, so the list grows with them. Each takes the record and returns findings.
MODEL_CHECKS: list[Callable[[PluginRecord], list[Finding]]] = []
