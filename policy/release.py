"""Which engine release a policy is written for, read from its files' ``version:``.

A file that mirrors vLLM says so in its version: ``vllm-0.33.0`` (one release) or
``vllm-0.27.1..0.33.0`` (every release of a range, its rules telling them apart with
``engine:`` conditions); one that mirrors SGLang, ``sglang-0.5.23``. The prefix names the
engine, and with it the decision vocabulary of the policy (:func:`engine_of`). Any other
version (``site-2026.12``, ``2026.09.01``) names no
release: a site layer inherits the release of the files below it. A host whose vLLM is
outside a file's release gets a decision established for another one, which is what the
commands warn about or refuse (:mod:`interlock.commands.release_check`).

Read without ``packaging`` (a warm ``policy explain`` must not import it); only a check
against an engine version parses that version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from interlock.core.decision import VOCABULARIES
from interlock.policy.model import Location, Policy

#: What a version names a vLLM release with.
PREFIX = "vllm-"
#: The prefix of each engine's releases: ``vllm-``, ``sglang-``.
PREFIXES = {engine: f"{engine}-" for engine in VOCABULARIES}
#: A release number (``0.33.0``): the part of PEP 440 a policy names releases by.
_RELEASE = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,5}")

Numbers = tuple[int, ...]


@dataclass(frozen=True)
class Release:
    """The engine release (or range of releases, both ends included) one policy file names."""

    first: Numbers
    last: Numbers
    location: Location
    engine: str = "vllm"

    @property
    def text(self) -> str:
        first, last = _dotted(self.first), _dotted(self.last)
        return first if first == last else f"{first} to {last}"

    def covers(self, version: str) -> bool:
        """Whether vLLM ``version`` (PEP 440, checked by whoever took it) is in the release.
        Pre-releases, dev and post-releases and local builds count as their release number
        (``0.33.0rc1``, ``0.33.0.post1`` and ``0.33.0+cu130`` are 0.33.0): a fleet runs
        them, and a policy for 0.33.0 means that release line."""
        from packaging.version import Version

        numbers = Version(version).release
        width = max(len(self.first), len(self.last), len(numbers))
        return _padded(self.first, width) <= _padded(numbers, width) <= _padded(self.last, width)

    def to_dict(self) -> dict[str, object]:
        return {"engine": self.engine, "first": _dotted(self.first), "last": _dotted(self.last),
                "location": self.location.to_dict()}


def releases(policy: Policy) -> tuple[Release, ...]:
    """The release each of the policy's files names, bottom first (files naming none left
    out)."""
    found = []
    for file in policy.files:
        engine = engine_of(file.version)
        numbers = None if engine is None else _numbers(file.version, PREFIXES[engine])
        if engine is not None and numbers is not None:
            found.append(Release(*numbers, Location(file.path, file.version_line), engine))
    return tuple(found)


def engine_of(version: str) -> str | None:
    """The engine a file's ``version:`` names a release of (``sglang-0.5.23``: sglang), or
    None for a version naming no engine (a site layer's)."""
    return next((e for e, prefix in PREFIXES.items() if version.startswith(prefix)), None)


def outside(policy: Policy, version: str, engine: str = "vllm") -> tuple[Release, ...]:
    """The releases named by the policy's files that ``engine``'s ``version`` is not in
    (those of another engine included): each such file was written for another release."""
    return tuple(r for r in releases(policy) if r.engine != engine or not r.covers(version))


def describe(policy: Policy) -> str:
    """``for vLLM 0.33.0 (version: policies.yaml:11)``, each release a file names; for a
    policy naming none, its versions."""
    named = releases(policy)
    if named:
        return "for " + " and ".join(cite(r) for r in named)
    versions = ", ".join(f"{f.version!r} at {f.path}:{f.version_line}" for f in policy.files)
    return f"for no vLLM release: no file's version is {PREFIX}X.Y.Z ({versions})"


def mismatch(policy: Policy, version: str, source: str, engine: str = "vllm") -> str | None:
    """Why ``engine``'s ``version`` (learnt as ``source`` says) is not what the policy is
    written for, or None when every release its files name covers it."""
    out = outside(policy, version, engine)
    if not out:
        return None
    return (f"{VOCABULARIES[engine].title} {version} ({source}) is outside what the policy "
            "is written for: "
            + " and ".join(cite(r) for r in out))


def cite(release: Release) -> str:
    """``vLLM 0.33.0 (version: policies.yaml:11)``."""
    return f"{VOCABULARIES[release.engine].title} {release.text} (version: {release.location})"


def _numbers(version: str, prefix: str = PREFIX) -> tuple[Numbers, Numbers] | None:
    """``(first, last)`` of a version that names a release (``vllm-0.33.0``,
    ``vllm-0.27.1..0.33.0``) of the engine ``prefix`` names, else None."""
    if not version.startswith(prefix):
        return None
    ends = version[len(prefix):].split("..")
    if len(ends) > 2 or not all(_RELEASE.fullmatch(end) for end in ends):
        return None
    first, last = (tuple(int(n) for n in end.split(".")) for end in (ends[0], ends[-1]))
    width = max(len(first), len(last))
    # A reversed range (vllm-0.33.0..0.27.1) names no release: it would cover none.
    return (first, last) if _padded(first, width) <= _padded(last, width) else None


def _dotted(numbers: Numbers) -> str:
    return ".".join(map(str, numbers))


def _padded(numbers: Numbers, width: int) -> Numbers:
    """``numbers`` with zeros to ``width`` parts: 0.33 is 0.33.0."""
    return numbers + (0,) * (width - len(numbers))
