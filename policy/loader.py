"""Finding, reading, layering and caching policies.

A warm load reads the files, hashes them and rebuilds the validated policy from
its JSON form in the cache (:mod:`interlock.policy.stored`): no YAML parser and
no pydantic are imported on that path.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from interlock import __version__
from interlock.core.disk_cache import read_json, write_json
from interlock.core.env import POLICY
from interlock.core.errors import PolicyError
from interlock.core.files import FileProblem, read_regular
from interlock.policy.model import Policy

#: The largest policy file read (a bigger one is refused before it is read whole).
MAX_FILE_BYTES = 4 * 1024 * 1024

#: Bump when the stored form changes in a way file stats would not reveal.
CACHE_FORMAT = 4
SHIPPED_NAME = "policies.yaml"
_PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_policy_path() -> Path:
    """The default policy: ``policy/policies.yaml``, a link to the repository's top-level file
    in a checkout, a regular file in an installed wheel."""
    return _PACKAGE_DIR / SHIPPED_NAME


@functools.cache
def shipped_sha256() -> str:
    """The shipped policy's content hash: a layer with this content is the shipped policy,
    whatever it was named by (``@shipped``, ``policies.yaml`` in a checkout, a copy)."""
    path = shipped_policy_path()
    return hashlib.sha256(read_source(path, SHIPPED_NAME)).hexdigest()


#: Names the shipped policy wherever a policy path is taken (``--policy @shipped``,
#: ``INTERLOCK_POLICY=@shipped:site.yaml``, ``policy diff @shipped @shipped:site.yaml``).
SHIPPED_ALIAS = "@shipped"
#: Names the policy of every vLLM release interlock has read (``examples/vllm-all-releases.yaml``
#: in a checkout, shipped beside the default policy): one rule set, each rule with its
#: releases, for hosts on a release the shipped policy is not written for.
ALL_RELEASES_ALIAS = "@all-releases"
#: Each alias, the file it names beside this module, and what it is.
#: Names the shipped SGLang policy (``examples/sglang.yaml`` in a checkout): SGLang's
#: decision fields, for ``policy explain --engine sglang`` and the plugin inside SGLang.
SGLANG_ALIAS = "@sglang"
ALIASES = {
    SHIPPED_ALIAS: (SHIPPED_NAME, "the shipped policy"),
    ALL_RELEASES_ALIAS: ("vllm-all-releases.yaml", "every vLLM release interlock has read"),
    SGLANG_ALIAS: ("sglang.yaml", "the shipped SGLang policy"),
}
#: The shipped policy of each engine: what ``--engine E`` decides with when no policy is named.
ENGINE_POLICIES = {"vllm": SHIPPED_ALIAS, "sglang": SGLANG_ALIAS}


def shipped_display(path: Path | None = None) -> str:
    """How locations name a shipped file (the shipped policy unless ``path``): relative to the
    current directory when it is below it (``policies.yaml`` in a checkout), else its absolute
    path, so that ``file:line`` opens from wherever the command ran."""
    real = (path or shipped_policy_path()).resolve()
    try:
        return str(real.relative_to(Path.cwd()))
    except ValueError:
        return str(real)


def parse_stack(text: str, origin: str) -> list[tuple[str, Path]]:
    """``(display name, path)`` of each file of one policy stack written as
    ``INTERLOCK_POLICY`` writes it: paths separated by ``os.pathsep``, bottom first, where
    :data:`SHIPPED_ALIAS` is the shipped policy. ``origin`` names where the text came from
    (``--policy``, ``INTERLOCK_POLICY``) for the error when it names no file."""
    files = []
    for item in text.split(os.pathsep):
        if item in ALIASES:
            path = _PACKAGE_DIR / ALIASES[item][0]
            files.append((shipped_display(path), path))
        elif item.startswith("@"):
            from interlock.core.suggest import hint

            known = ", ".join(f"{alias} ({what})" for alias, (_, what) in ALIASES.items())
            raise PolicyError(
                f"{origin}: unknown policy alias {item!r}; the aliases are {known}"
                + hint(item, list(ALIASES))
            )
        elif item:
            files.append((item, Path(item)))
    if not text:
        raise PolicyError(f"{origin} '': an empty path names no policy file")
    if not files:
        raise PolicyError(
            f"{origin}={text!r} names no policy file; give file paths separated by "
            f"{os.pathsep!r} ({SHIPPED_ALIAS} is the shipped policy)"
        )
    return files


def policy_paths(paths: Sequence[str | os.PathLike[str]] | None = None) -> list[tuple[str, Path]]:
    """``(display name, path)`` of the files to layer: the given ones (each may be a stack,
    see :func:`parse_stack`), else ``$INTERLOCK_POLICY``, else the shipped policy."""
    if paths:
        return [f for p in paths for f in parse_stack(os.fspath(p), "--policy")]
    # Set and empty reads as unset, as shells leave it after `INTERLOCK_POLICY=`.
    stack = os.environ.get(POLICY.name)
    if stack:
        return parse_stack(stack, POLICY.name)
    return [(shipped_display(), shipped_policy_path())]


def read_source(path: Path, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """Read a policy file (a regular file: a FIFO or device is refused, not waited on),
    refusing one over ``limit`` bytes without reading it whole."""
    try:
        return read_regular(path, limit, name)
    except FileProblem as exc:
        raise PolicyError(
            f"cannot read policy file: {exc.detail}", file=exc.file or repr(name)
        ) from None


def load_policy(
    paths: Sequence[str | os.PathLike[str]] | None = None, *, use_cache: bool = True
) -> Policy:
    """Load and layer policy files (see :func:`policy_paths`); raises :class:`PolicyError`."""
    sources = [(name, read_source(path, name)) for name, path in policy_paths(paths)]
    return load_policy_sources(sources, use_cache=use_cache)


def load_policy_text(text: str | bytes, name: str = "<policy>") -> Policy:
    """Load one policy given as text (tests, tools comparing revisions); never cached."""
    data = text.encode() if isinstance(text, str) else text
    if len(data) > MAX_FILE_BYTES:
        raise PolicyError(f"policy file is larger than the {MAX_FILE_BYTES} byte limit", file=name)
    return load_policy_sources([(name, data)], use_cache=False)


def load_policy_sources(sources: list[tuple[str, bytes]], *, use_cache: bool = True) -> Policy:
    """Layer ``(display name, content)`` sources in order, through the cache."""
    hashed = [(name, content, hashlib.sha256(content).hexdigest()) for name, content in sources]
    revision = hashlib.sha256("".join(sha for _, _, sha in hashed).encode()).hexdigest()[:16]
    key = _cache_key(hashed) if use_cache else ""
    if use_cache:
        cached = _from_cache(key, revision, [sha for _, _, sha in hashed])
        if cached is not None:
            return cached
    from interlock.policy.build import build_policy

    policy = build_policy(hashed, revision)
    if use_cache:
        from interlock.policy.stored import policy_to_data

        write_json("policy", key, policy_to_data(policy))
    return policy


def _from_cache(key: str, revision: str, shas: list[str]) -> Policy | None:
    """The cached policy for these sources, or None (absent, damaged, or for other files)."""
    data = read_json("policy", key)
    if data is None:
        return None
    from interlock.policy.stored import policy_from_data

    try:
        policy = policy_from_data(data)
    except ValueError:
        return None
    if policy.revision != revision or [f.sha256 for f in policy.files] != shas:
        return None
    return policy


def _code_fingerprint() -> str:
    """Identifies the code that wrote an entry: format, Python, and the policy modules' stats."""
    parts = [str(CACHE_FORMAT), __version__, sys.version]
    with os.scandir(_PACKAGE_DIR) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name.endswith(".py"):
                st = entry.stat()
                parts.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _cache_key(hashed: list[tuple[str, bytes, str]]) -> str:
    h = hashlib.sha256(_code_fingerprint().encode())
    for name, _, sha in hashed:
        # Display names are part of the key: they appear in every location.
        h.update(f"\0{name}\0{sha}".encode())
    return h.hexdigest()[:32]
