"""Running git on a repository interlock did not create, without running its config.

``policy check`` asks git about the folder of a policy and of the records it cites, and
``policy diff git:REV`` reads a revision; either folder may come from an untrusted bundle
with its own ``.git/config``. Several config keys make git run a program:
``core.fsmonitor``, hooks (``core.hooksPath``), ``core.pager``, ``diff.external``, the
``textconv``/``command`` of a diff driver, the ``clean``/``smudge``/``process`` of a
filter driver (run while ``status`` and ``blame`` read the working tree) and
``gpg.program`` under ``log.showSignature``. :func:`run_git` overrides every one of them,
after listing the repository's drivers (reading config runs nothing), ignores the
system-wide config and the caller's ``GIT_*`` variables, and leaves ``safe.directory``
alone: git's own refusal of a repository owned by someone else still applies.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

#: Config values that disable a program git would otherwise run.
_DISABLED = {
    "core.fsmonitor": "false",
    "core.hooksPath": os.devnull,
    "core.pager": "cat",
    "core.untrackedCache": "false",
    "diff.external": "",
    "log.showSignature": "false",
    "gpg.program": "false",
    "gpg.ssh.program": "false",
    "gpg.x509.program": "false",
    "protocol.allow": "never",
}
#: Per-driver keys naming a program, and the value that turns each off.
_DRIVER_KEYS = {
    "filter": {"clean": "", "smudge": "", "process": "", "required": "false"},
    "diff": {"textconv": "", "command": ""},
}
_DRIVER = re.compile(r"^(filter|diff)\.(.+)\.([a-z]+)$")


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_OPTIONAL_LOCKS="0",  # `status` does not rewrite the index
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_PAGER="cat",
        PAGER="cat",
    )
    return env


def _with_config(env: dict[str, str], config: dict[str, str]) -> dict[str, str]:
    """``env`` passing ``config`` as command-line config (``GIT_CONFIG_COUNT``: a driver
    name holding ``=`` cannot be misparsed, as in ``-c key=value``)."""
    out = dict(env, GIT_CONFIG_COUNT=str(len(config)))
    for i, (key, value) in enumerate(config.items()):
        out[f"GIT_CONFIG_KEY_{i}"] = key
        out[f"GIT_CONFIG_VALUE_{i}"] = value
    return out


def _driver_overrides(cwd: Path, env: dict[str, str], timeout: float) -> dict[str, str]:
    """Blank values for every filter and diff driver the repository's config names."""
    listed = subprocess.run(
        ["git", "--no-pager", "config", "--list", "-z", "--name-only"],
        cwd=cwd, env=_with_config(env, _DISABLED), capture_output=True, check=False,
        timeout=timeout,
    )
    overrides: dict[str, str] = {}
    for raw in listed.stdout.split(b"\0") if listed.returncode == 0 else ():
        match = _DRIVER.match(raw.decode(errors="replace"))
        if match:
            kind, name = match.group(1), match.group(2)
            for key, value in _DRIVER_KEYS[kind].items():
                overrides[f"{kind}.{name}.{key}"] = value
    return overrides


def run_git(
    args: list[str], cwd: Path | None = None, *, timeout: float = 30
) -> subprocess.CompletedProcess[bytes]:
    """``git ARGS`` in ``cwd`` with every config-driven program disabled (see the module's
    docstring); raises OSError when git is missing, TimeoutExpired after ``timeout``."""
    where = Path.cwd() if cwd is None else cwd
    env = _base_env()
    config = {**_DISABLED, **_driver_overrides(where, env, timeout)}
    return subprocess.run(
        ["git", "--no-pager", *args], cwd=where, env=_with_config(env, config),
        capture_output=True, check=False, timeout=timeout, stdin=subprocess.DEVNULL,
    )
