"""The result of a plugin discovery: every plugin with its status, and the runners they provide."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from interlock.core.env import DISABLE_PLUGINS
from interlock.core.suggest import hint
from interlock.plugins.settings import PluginError
from interlock.plugins.spec import KernelSpec, RunnerSpec

Status = Literal["ok", "failed", "disabled", "incompatible"]
#: The distribution of the built-in plugins (mrv1, mrv2), which others cannot shadow.
BUILTIN_DISTRIBUTION = "interlock"


@dataclass(frozen=True)
class PluginRecord:
    """One plugin as discovered: where it comes from, its status, what it provides."""

    name: str
    distribution: str
    version: str
    source: str  # the entry point value, or where an in-process plugin was registered
    status: Status
    detail: str = ""  # the failure summary or the incompatibility, for those statuses
    runners: tuple[RunnerSpec, ...] = ()
    kernels: tuple[KernelSpec, ...] = ()

    @property
    def status_line(self) -> str:
        return f"{self.status}: {self.detail}" if self.detail else self.status

    @property
    def provider(self) -> str:
        """``name (distribution version)``, as messages cite a plugin."""
        return f"{self.name} ({self.distribution} {self.version})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "source": self.source,
            "status": self.status,
            "detail": self.detail,
            "runners": [spec.to_dict() for spec in self.runners],
            "kernels": [spec.to_dict() for spec in self.kernels],
        }


@dataclass(frozen=True)
class RegisteredRunner:
    spec: RunnerSpec
    plugin: PluginRecord


class PluginRegistry:
    """Runners by name, built from the ok plugins; conflicts are kept, never resolved by order."""

    def __init__(self, plugins: Sequence[PluginRecord], unknown_disabled: Sequence[str] = ()):
        self.plugins = tuple(plugins)
        self.unknown_disabled = tuple(unknown_disabled)
        providers: dict[str, list[RegisteredRunner]] = {}
        for plugin in self.plugins:
            if plugin.status == "ok":
                for spec in plugin.runners:
                    providers.setdefault(spec.name, []).append(RegisteredRunner(spec, plugin))
        self._runners = {name: regs[0] for name, regs in providers.items() if len(regs) == 1}
        #: A runner name a third-party plugin reuses from a built-in one: the built-in is
        #: kept (as for plugin names, see discovery), the others listed here.
        self.shadowed: dict[str, tuple[RegisteredRunner, tuple[PluginRecord, ...]]] = {}
        self.conflicts: dict[str, tuple[PluginRecord, ...]] = {}
        for name, regs in providers.items():
            if len(regs) < 2:
                continue
            builtin = [r for r in regs if r.plugin.distribution == BUILTIN_DISTRIBUTION]
            if len(builtin) == 1:
                self._runners[name] = builtin[0]
                others = tuple(r.plugin for r in regs if r is not builtin[0])
                self.shadowed[name] = (builtin[0], others)
            else:
                self.conflicts[name] = tuple(r.plugin for r in regs)

    def runner_names(self) -> list[str]:
        """Names a policy may use: registered by exactly one ok plugin."""
        return sorted(self._runners)

    def runners(self) -> Iterator[RegisteredRunner]:
        for name in self.runner_names():
            yield self._runners[name]

    def find(self, name: str) -> RegisteredRunner | None:
        return self._runners.get(name)

    def platforms(self) -> list[str]:
        """Every platform a registered runner serves (the built-in ones and any a plugin
        declares), in first-served order."""
        seen: dict[str, None] = {}
        for reg in self.runners():
            seen.update(dict.fromkeys(reg.spec.platforms))
        return list(seen)

    def runner(self, name: str) -> RegisteredRunner:
        """The runner called ``name``; PluginError saying why when there is no single one."""
        found = self._runners.get(name)
        if found is None:
            raise PluginError(self.why_missing(name))
        return found

    def failed(self) -> list[PluginRecord]:
        return [p for p in self.plugins if p.status == "failed"]

    def why_missing(self, name: str) -> str:
        """Why no runner ``name`` can be used, naming every plugin that could be the cause."""
        if name in self.conflicts:
            a, b, *rest = self.conflicts[name]
            others = "".join(f", {p.provider}" for p in rest)
            return (
                f"runner {name!r} is registered by two plugins, {a.provider} and "
                f"{b.provider}{others}; neither is preferred: disable one with "
                f"{DISABLE_PLUGINS.name}={a.name} or {DISABLE_PLUGINS.name}={b.name}"
            )
        lines = [
            f"runner {name!r} is not registered{hint(name, self.runner_names())}; "
            f"registered runners: {', '.join(self.runner_names()) or '(none)'}"
        ]
        for plugin in self.plugins:
            if plugin.status == "ok":
                continue
            if any(spec.name == name for spec in plugin.runners):
                lines.append(
                    f"it is provided by plugin {plugin.provider}, which is {plugin.status_line}"
                )
            elif plugin.status == "failed" and not plugin.runners:
                lines.append(
                    f"plugin {plugin.provider} may provide it but failed to load: {plugin.detail}"
                )
            elif plugin.status == "disabled":
                lines.append(
                    f"plugin {plugin.provider} may provide it but is disabled by "
                    f"{DISABLE_PLUGINS.name}"
                )
        return "; ".join(lines)

    def shadowing(self, name: str) -> list[str]:
        """The clash of a third-party runner named like built-in runner ``name``, one line per
        plugin reusing the name, naming both distributions."""
        kept, others = self.shadowed[name]
        return [
            f"runner {name!r} is registered by the built-in plugin {kept.plugin.provider} and "
            f"by {plugin.provider}; the built-in one is kept, and {plugin.provider}'s {name!r} "
            f"is never used: rename it (RunnerSpec(name=...)) in {plugin.distribution}"
            for plugin in others
        ]

    def problems(self) -> list[str]:
        """Registry-wide inconsistencies: conflicts, dangling or cyclic fallbacks, stray names."""
        found = [self.why_missing(name) for name in sorted(self.conflicts)]
        for name in sorted(self.shadowed):
            found += self.shadowing(name)
        for reg in self.runners():
            chain = [reg.spec.name]
            spec: RunnerSpec | None = reg.spec
            while spec is not None and spec.fallback is not None:
                if spec.fallback in chain:
                    found.append(
                        f"runner {reg.spec.name!r}: fallback chain loops: "
                        f"{' -> '.join([*chain, spec.fallback])}"
                    )
                    break
                chain.append(spec.fallback)
                nxt = self.find(spec.fallback)
                if nxt is None:
                    found.append(
                        f"runner {spec.name!r} (plugin {reg.plugin.provider}) falls back "
                        f"to {spec.fallback!r}, which is not registered"
                    )
                spec = nxt.spec if nxt else None
        found += [
            f"{DISABLE_PLUGINS.name} names {name!r}, which is not an installed plugin"
            for name in self.unknown_disabled
        ]
        return sorted(set(found), key=found.index)
