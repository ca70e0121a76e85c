"""The one error type of the policy engine: a message pinned to file:line:col and a dotted path."""

from __future__ import annotations


class PolicyError(Exception):
    """A policy or input error; ``str()`` reads ``policies.yaml:42:7: rules[3].set.runner: ...``.

    ``more`` holds further errors found in the same pass (e.g. several schema
    violations), printed one per line after the first.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        col: int | None = None,
        path: str | None = None,
        more: tuple[PolicyError, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.col = col
        self.path = path
        self.more = more

    @property
    def where(self) -> str:
        """``file:line:col`` (as much of it as is known), or empty."""
        if self.file is None:
            return ""
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.col is not None:
                parts.append(str(self.col))
        return ":".join(parts)

    def _one_line(self) -> str:
        prefix = [p for p in (self.where, self.path) if p]
        return ": ".join([*prefix, self.message])

    def __str__(self) -> str:
        return "\n".join([self._one_line(), *(e._one_line() for e in self.more)])


def dotted(path: tuple[str | int, ...]) -> str:
    """``("rules", 3, "set", "runner")`` -> ``rules[3].set.runner``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out
