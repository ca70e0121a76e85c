"""The errors interlock reports to a user, and the exit code of each kind.

Every error meant for the user carries a ``kind`` (a class attribute); the
command line maps it to an exit code (:data:`EXIT_CODES`), and anything
without one is a bug (exit 70, with a traceback). :class:`LocatedError` is an error that
can say where (file:line:col, a dotted path) and can carry further lines and errors;
:class:`PolicyError` is the policy engine's, and the plugins' and the engines' failures
have bases of their own on it.
"""

from __future__ import annotations

from interlock.core.terminal import one_line

#: Exit code of each outcome (documented in README "Security").
EXIT_CODES = {
    "ok": 0,
    "policy": 1,  # a policy file, or input the policy is asked about
    "input": 1,  # a value given on the command line or through the API
    "usage": 2,
    "plugin": 3,
    "model": 4,  # config.json, checkpoint, tokenizer: the model cannot run as given
    "runtime": 4,  # the run failed (out of memory, a failing step)
    "refused": 5,  # a rule of the policy refuses the context (its `refuse:`)
    "internal": 70,  # a bug in interlock
    "interrupted": 130,
}


class InterlockError(Exception):
    """An error for the user (not a bug); ``kind`` is a key of :data:`EXIT_CODES`."""

    kind = "input"


class InputError(InterlockError, ValueError):
    """A value given by the caller is refused; the message names it and what is allowed."""


class ModelError(InterlockError, ValueError):
    """A model (config.json, checkpoint, tokenizer) cannot run as given; names the file."""

    kind = "model"


def error_kind(exc: BaseException) -> str | None:
    """The kind of a user-facing error (see :data:`EXIT_CODES`), None for a bug."""
    kind = getattr(type(exc), "kind", None)
    return kind if isinstance(kind, str) and kind in EXIT_CODES else None


class LocatedError(InterlockError):
    """An error that says where: ``str()`` reads ``policies.yaml:42:7: rules[3].set.runner: ...``.

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
        more: tuple[LocatedError, ...] = (),
        details: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        #: Lines of interlock's own that follow the message (a list of what failed, the
        #: ways out); each is one line, like the message, whatever values it quotes.
        self.details = details
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

    def location(self) -> dict[str, object] | None:
        """``{"file", "line", "col", "path"}`` as known, for a ``--json`` error document."""
        if self.file is None and self.path is None:
            return None
        return {"file": self.file, "line": self.line, "col": self.col, "path": self.path}

    def _one_line(self) -> str:
        prefix = [p for p in (self.where, self.path) if p]
        # One line per error: a line break in a quoted value or a file name is shown.
        return one_line(": ".join([*prefix, self.message]))

    def __str__(self) -> str:
        own = [self._one_line(), *map(one_line, self.details)]
        return "\n".join([*own, *(str(e) for e in self.more)])


class PolicyError(LocatedError):
    """A policy or input error: a policy file, or what the policy is asked about."""

    kind = "policy"


def dotted(path: tuple[str | int, ...]) -> str:
    """``("rules", 3, "set", "runner")`` -> ``rules[3].set.runner``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out
