"""The policy's vLLM release against the host's (:mod:`interlock.policy.release`).

``policy explain`` is a what-if tool: it names the release and warns when the version it
is given is outside it. ``policy vllm args|serve`` hand the decision to a real vLLM, so a
host outside the release is refused (exit ``refused``, 5) unless ``--allow-version-mismatch``
says to go on: a 0.31 host must not silently get a decision established for 0.33.
"""

from __future__ import annotations

import argparse
import sys

from interlock.core.errors import PolicyError
from interlock.policy.model import Policy
from interlock.policy.release import describe, mismatch, releases
from interlock.vllm.releases import use_instead

ALLOW_FLAG = "--allow-version-mismatch"


class ReleaseMismatch(PolicyError):
    """The engine's vLLM is outside the release the policy is written for: exit 5, as a
    rule's refusal, for the policy will not decide for that engine."""

    kind = "refused"


def add_allow_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        ALLOW_FLAG, dest="allow_version_mismatch", action="store_true",
        help="use the policy on a vLLM outside the release its `version:` names (refused "
        "otherwise, exit 5)",
    )


def warn_outside(command: str, policy: Policy, version: str | None, source: str) -> None:
    """A warning on stderr when the given vLLM ``version`` is outside the policy's release."""
    problem = None if version is None else mismatch(policy, version, source)
    if problem is not None:
        assert version is not None
        print(f"{command}: warning: {problem}; the decision shown is that release's, not "
              f"necessarily vLLM {version}'s: {use_instead(version)}", file=sys.stderr)


def refuse_outside(command: str, policy: Policy, version: str | None, source: str) -> None:
    """:class:`ReleaseMismatch` when vLLM ``version`` is outside the policy's release."""
    problem = None if version is None else mismatch(policy, version, source)
    if problem is not None:
        assert version is not None
        raise ReleaseMismatch(f"{command}: {problem}, so its cells would be another "
                              f"release's decisions: {use_instead(version)}")


def engine_lines(policy: Policy, version: str | None, source: str, *, allow: bool) -> list[str]:
    """What ``policy vllm`` says about the release on stderr; raises :class:`ReleaseMismatch`
    when ``version`` is outside it and ``allow`` is false."""
    lines = [f"policy {describe(policy)}"]
    if version is None:
        if releases(policy):
            lines.append("warning: no vLLM version to check the policy's release against "
                         "(give --vllm PATH or --engine-version vllm=X.Y.Z)")
        return lines
    problem = mismatch(policy, version, source)
    if problem is None:
        return lines
    if not allow:
        raise ReleaseMismatch(
            f"{problem}; its decision may not be what vLLM {version} needs or can run: "
            f"{use_instead(version)}, or give {ALLOW_FLAG} to use this one anyway"
        )
    lines.append(f"warning: {problem}; going on ({ALLOW_FLAG})")
    return lines
