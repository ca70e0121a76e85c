"""How discovery behaves, from the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from interlock.core.env import DISABLE_PLUGINS, PLUGINS_STRICT
from interlock.core.errors import LocatedError


class PluginError(LocatedError):
    """A plugin problem that must stop the caller (strict mode, unknown or conflicting runner,
    a runner factory that does not import); exit 3 on the command line."""

    kind = "plugin"


@dataclass(frozen=True)
class Settings:
    disabled: frozenset[str] = frozenset()
    strict: bool = False  # plugin failures raise instead of being quarantined

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        strict = env.get(PLUGINS_STRICT.name, "").strip()
        if strict not in ("", "0", "1"):
            raise PluginError(f"{PLUGINS_STRICT.name}={strict!r}: allowed values are 0 and 1")
        names = env.get(DISABLE_PLUGINS.name, "").split(",")
        disabled = frozenset(n.strip() for n in names if n.strip())
        return cls(disabled=disabled, strict=strict == "1")
