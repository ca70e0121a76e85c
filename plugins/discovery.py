"""Loading plugins: entry points in, a registry out, every failure quarantined.

Each plugin is imported and asked for its declarations on its own, so one
broken plugin is recorded as failed (with the exception summary) and the rest
keep working; strict mode turns such a failure into an error for plugin authors.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from interlock.core.env import DISABLE_PLUGINS, PLUGINS_STRICT
from interlock.plugins.api import ENTRY_POINT_GROUP, api_incompatibility
from interlock.plugins.isolation import PluginCrash, plugin_code
from interlock.plugins.registry import (
    BUILTIN_DISTRIBUTION,
    PluginRecord,
    PluginRegistry,
    Status,
)
from interlock.plugins.settings import PluginError, Settings
from interlock.plugins.spec import KernelSpec, RunnerSpec, SpecError

SpecT = TypeVar("SpecT", RunnerSpec, KernelSpec)


@dataclass(frozen=True)
class PluginSource:
    """A plugin to load: an installed entry point, or an object registered in-process."""

    name: str
    distribution: str
    version: str
    source: str
    load: Callable[[], Any] = field(compare=False)
    module: str | None = None  # the module the entry point imports (its files are watched)


@dataclass
class Discovery:
    """A registry and the files whose change would change it (for the cache)."""

    registry: PluginRegistry
    watched: list[str]


class _Failure(Exception):
    """A plugin broke its contract; the message is the whole story."""


def entry_point_sources() -> list[PluginSource]:
    from importlib.metadata import entry_points

    sources = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        sources.append(
            PluginSource(
                name=ep.name,
                distribution=dist.name if dist is not None else "(unknown distribution)",
                version=dist.version if dist is not None else "?",
                source=ep.value,
                load=ep.load,
                module=ep.module,
            )
        )
    return sources


def discover(sources: Sequence[PluginSource], settings: Settings) -> Discovery:
    import pluggy

    from interlock.plugins.hookspecs import PROJECT, Hooks

    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(Hooks)
    enabled = [s for s in sources if not _is_disabled(s, settings)]
    clashing = _clashing_names(enabled)
    modules_before = set(sys.modules)
    records = []
    for src in sources:
        if _is_disabled(src, settings):
            records.append(_record(src, "disabled"))
        elif src in clashing:
            records.append(_record(src, "failed", clashing[src]))
        else:
            records.append(_load(manager, src, settings.strict))
    known = {s.name for s in sources} | {f"{s.distribution}:{s.name}" for s in sources}
    registry = PluginRegistry(records, sorted(settings.disabled - known))
    strict = f"{PLUGINS_STRICT.name}=1: "
    if settings.strict and registry.conflicts:
        raise PluginError(strict + registry.why_missing(min(registry.conflicts)))
    if settings.strict and registry.shadowed:
        raise PluginError(strict + registry.shadowing(min(registry.shadowed))[0])
    return Discovery(registry, _watched_files(sources, modules_before))


def _is_disabled(src: PluginSource, settings: Settings) -> bool:
    """``INTERLOCK_DISABLE_PLUGINS`` names a plugin, or ``distribution:plugin`` to pick one of
    two plugins with one name."""
    return src.name in settings.disabled or f"{src.distribution}:{src.name}" in settings.disabled


def _clashing_names(sources: Sequence[PluginSource]) -> dict[PluginSource, str]:
    """The plugins not loaded because another enabled plugin has their name, and why.

    A built-in plugin (distribution ``interlock``) is never shadowed: it is kept
    and the others are refused; among third-party plugins none is preferred.
    """
    by_name: dict[str, list[PluginSource]] = {}
    for src in sources:
        by_name.setdefault(src.name, []).append(src)
    refused = {}
    for name, group in by_name.items():
        if len(group) < 2:
            continue
        users = " and ".join(f"{s.distribution} {s.version}" for s in group)
        choose = " or ".join(f"{DISABLE_PLUGINS.name}={s.distribution}:{name}" for s in group)
        builtin = [s for s in group if s.distribution == BUILTIN_DISTRIBUTION]
        for src in group:
            if builtin and src not in builtin:
                refused[src] = (
                    f"plugin name {name!r} is used by {users}; the built-in one is kept "
                    f"(choose with {choose})"
                )
            elif not builtin:
                refused[src] = f"plugin name {name!r} is used by {users}; choose with {choose}"
    return refused


def _record(
    src: PluginSource, status: Status, detail: str = "", **provided: Any
) -> PluginRecord:
    return PluginRecord(
        name=src.name,
        distribution=src.distribution,
        version=src.version,
        source=src.source,
        status=status,
        detail=detail,
        **provided,
    )


def _load(manager: Any, src: PluginSource, strict: bool) -> PluginRecord:
    from interlock.plugins.hookspecs import HOOK_NAMES

    plugin = None
    try:
        with plugin_code():
            plugin = src.load()
        manager.register(plugin, name=src.name)
        unknown = [hc.name for hc in manager.get_hookcallers(plugin) if not hc.has_spec()]
        if unknown:
            raise _Failure(
                f"implements unknown hooks {', '.join(unknown)}; the hooks are: "
                f"{', '.join(HOOK_NAMES)}"
            )
        runners = _declarations(manager, plugin, "interlock_runner_specs", RunnerSpec)
        incompatible = _incompatibility(runners)
        if incompatible is None:
            kernels = _declarations(manager, plugin, "interlock_kernel_specs", KernelSpec)
            incompatible = _incompatibility(kernels)
    except Exception as exc:  # quarantine: any failure of a plugin is recorded, not raised
        if plugin is not None and manager.is_registered(plugin):
            manager.unregister(plugin)
        if strict:
            raise PluginError(
                f"{PLUGINS_STRICT.name}=1: plugin {src.name} ({src.distribution} {src.version}) "
                f"failed: {summarize(exc)}"
            ) from exc
        return _record(src, "failed", summarize(exc))
    if incompatible is not None:
        # Skipped before anything else of it runs: no further hooks, no factory import.
        manager.unregister(plugin)
        return _record(src, "incompatible", incompatible, runners=runners)
    return _record(src, "ok", runners=runners, kernels=kernels)


def _declarations(manager: Any, plugin: Any, hook: str, kind: type[SpecT]) -> tuple[SpecT, ...]:
    # Each plugin's implementation is called on its own, so that one plugin's
    # exception is attributed to it and does not stop the others.
    found: list[SpecT] = []
    for impl in getattr(manager.hook, hook).get_hookimpls():
        if impl.plugin is not plugin:
            continue
        with plugin_code():
            result = impl.function()
        if not isinstance(result, (list, tuple)):
            raise _Failure(
                f"{hook} returned {type(result).__name__}, expected a list of {kind.__name__}"
            )
        for item in result:
            if not isinstance(item, kind):
                raise _Failure(f"{hook} returned a {type(item).__name__}, expected {kind.__name__}")
            found.append(item)
    return tuple(found)


def _incompatibility(specs: Iterable[RunnerSpec | KernelSpec]) -> str | None:
    for spec in specs:
        why = api_incompatibility(spec.plugin_api)
        if why is not None:
            label = (
                f"runner {spec.name!r}"
                if isinstance(spec, RunnerSpec)
                else (f"kernel {spec.op}/{spec.backend}")
            )
            return f"{label} {why}"
    return None


def summarize(exc: BaseException) -> str:
    """One line: the exception type and message, and the plugin code line that raised it."""
    if isinstance(exc, SpecError):
        text = f"invalid declaration: {exc}"
    elif isinstance(exc, (_Failure, PluginCrash)):
        text = str(exc)
        exc = exc.__cause__ or exc  # where the plugin raised it
    else:
        text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    # The line to show is the plugin's own: skip the import system, pluggy and the host's
    # machinery, but not interlock's runners and kernels, where the built-in plugins and
    # the runner code a plugin's factory runs live.
    # (interlock.core, interlock.plugins and interlock.policy live in their own root folders.)
    machinery = tuple(_package_dir(name) for name in (
        "importlib", "pluggy", "interlock", "interlock.core", "interlock.plugins",
        "interlock.policy",
    ))
    own = tuple(_package_dir(f"interlock.{name}") for name in ("runners", "kernels"))
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if f.filename.startswith(own) or not f.filename.startswith(("<", *machinery))
    ]
    return f"{text} (at {frames[-1].filename}:{frames[-1].lineno})" if frames else text


def _package_dir(name: str) -> str:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    return os.path.dirname(path) + os.sep if path else "<none>"


def _watched_files(sources: Sequence[PluginSource], modules_before: set[str]) -> list[str]:
    """The source files the declarations came from: what imports brought in, and each
    plugin's own package (it may have been imported before discovery ran)."""
    # interlock itself too: specs hold compiled conditions (interlock.policy.conditions objects).
    packages = {"interlock", *(s.module.split(".")[0] for s in sources if s.module)}
    files = set(_entry_point_files())
    for name, module in list(sys.modules.items()):
        if name not in modules_before or name.split(".")[0] in packages:
            path = getattr(module, "__file__", None)
            if path:
                files.add(path)
    return sorted(files)


def _entry_point_files() -> list[str]:
    """The ``entry_points.txt`` on ``sys.path`` that declare interlock plugins: editing one in
    place changes what is discovered but not the directory it sits in. (Only these are
    watched, so that a warm start stats a handful of files, not every distribution's.)"""
    found = []
    for entry in sys.path:
        try:
            with os.scandir(entry or os.curdir) as items:
                names = [i.name for i in items if i.name.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue
        for name in names:
            path = os.path.join(os.path.abspath(entry or os.curdir), name, "entry_points.txt")
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    declares = f"[{ENTRY_POINT_GROUP}]" in fh.read()
            except OSError:
                continue
            if declares:
                found.append(path)
    return found
