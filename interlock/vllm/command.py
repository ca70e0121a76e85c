"""Driving ``vllm serve`` with the policy's decision, every field explicit.

vLLM reads its runner and graph settings from environment variables and compilation
flags; left unset it decides by itself (and, for the architectures on its breakable list,
switches breakable graphs on and compilation off). So the command sets every knob the
release reads (:mod:`interlock.vllm.releases`): ``VLLM_USE_V2_MODEL_RUNNER`` where the
release has it (not from 0.34.0, which removed Model Runner V1),
``VLLM_USE_BREAKABLE_CUDAGRAPH`` (even 0), ``-cc.cudagraph_mode`` and ``-cc.mode``.

The user's own env vars and ``vllm serve`` flags win: they enter the resolution as env
bindings, overrides and given features (:mod:`interlock.vllm.flags` reads them; ``policy
explain`` would show them) and pass through unchanged. What the release does with explicit
values (its adjustments, its optimization level, what it refuses) is the resolution's
engine stage (:mod:`interlock.vllm.stage`), so the decision printed is the one vLLM runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from interlock.core.errors import PolicyError
from interlock.policy.resolution import Resolution
from interlock.policy.trace import ENGINE
from interlock.vllm.flags import UserFlags
from interlock.vllm.releases import (
    BREAKABLE_KNOB,
    COMPILE_KNOB,
    CUDAGRAPH_KNOB,
    RUNNER_KNOB,
    Release,
    binding_problems,
)
from interlock.vllm.stage import by_level


@dataclass(frozen=True)
class ServeCommand:
    resolution: Resolution
    #: The release it is written for (None: unknown, every knob is set).
    release: Release | None
    env: dict[str, str]
    argv: list[str]

    @property
    def decision(self) -> dict[str, Any]:
        """The decision vLLM will run: the resolution's, the release's stage included."""
        return self.resolution.decision.to_dict()

    def adjustments(self) -> list[dict[str, Any]]:
        """What the release changed, from the resolution's engine stage."""
        return [
            {"field": name, "from": step.before.get(name), "to": value, "why": step.note,
             "where": str(step.location) if step.location else None}
            for step in self.resolution.trace if step.stage == ENGINE
            for name, value in step.sets.items()
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "vllm_release": self.release.version if self.release else None,
            "adjustments": self.adjustments(),
            "env": self.env,
            "argv": self.argv,
            "resolution": self.resolution.to_dict(),
        }


def model_argument(model: str) -> str:
    """``model`` as ``vllm serve``'s positional argument: a directory named like a flag
    (``--enforce-eager``, ``-cc.mode=NONE``, ``--``) would reach vLLM as that flag and the
    model would be lost, so such a name is passed as ``./NAME``, the same directory."""
    if not model:
        raise PolicyError("the model path is empty")
    return f"./{model}" if model.startswith("-") else model


def serve_command(
    resolution: Resolution,
    model: str,
    user_args: Sequence[str],
    user: UserFlags,
    extra: Sequence[str] = (),
    release: Release | None = None,
) -> ServeCommand:
    """The ``vllm serve`` command (argv and env additions) that runs ``resolution`` on vLLM
    ``release`` (None: unknown, every knob is set): only the env vars and flags that release
    reads. ``resolution`` was decided with that release's stage, which refused what the
    release cannot run. ``extra`` are flags for features given with ``--feature`` only."""
    # The policy reads the variables this command sets: read otherwise than vLLM reads them,
    # the engine would run something other than what the policy decides from them.
    problems = binding_problems(resolution.policy.env)
    if problems:
        raise PolicyError("the policy's env bindings disagree with vLLM's knobs "
                          "(interlock/vllm/releases.py KNOBS): " + "; ".join(problems))
    final = resolution.decision.to_dict()
    runner = final["runner"]
    if runner not in dict(RUNNER_KNOB.values):
        raise PolicyError(
            f"the policy chose runner {runner!r} ({resolution.provenance['runner'].source}); "
            f"vLLM has {' and '.join(dict(RUNNER_KNOB.values))} only"
        )

    def reads(knob: Any) -> bool:
        return release is None or release.reads(knob)

    env = {}
    if reads(RUNNER_KNOB):
        env[RUNNER_KNOB.name] = RUNNER_KNOB.text(runner)
    if reads(BREAKABLE_KNOB):
        env[BREAKABLE_KNOB.name] = BREAKABLE_KNOB.text(bool(final["breakable"]))
    # Fields the user set, or the user's -O level decided (vLLM applies it itself), get no flag.
    given = set(user.overrides) | {
        name for name, prov in resolution.provenance.items() if by_level(prov)}
    flags = []
    if "cudagraph" not in given and reads(CUDAGRAPH_KNOB):
        flags.append(f"{CUDAGRAPH_KNOB.name}={final['cudagraph'].upper()}")
    if "compile" not in given and reads(COMPILE_KNOB):
        flags.append(f"{COMPILE_KNOB.name}={'VLLM_COMPILE' if final['compile'] else 'NONE'}")
    sizes = final.get("capture_sizes")
    if sizes:
        flags.append(
            f"-cc.cudagraph_capture_sizes={json.dumps(list(sizes), separators=(',', ':'))}"
        )
    argv = ["vllm", "serve", model_argument(model), *flags, *extra, *user_args]
    return ServeCommand(resolution, release, env, argv)
