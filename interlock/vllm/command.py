"""Driving ``vllm serve`` with the policy's decision, every field explicit.

vLLM reads its runner and graph settings from two environment variables and
compilation flags; left unset it decides by itself (and, for the architectures
on its breakable list, switches breakable graphs on and compilation off). So the
command sets all of them: ``VLLM_USE_V2_MODEL_RUNNER``,
``VLLM_USE_BREAKABLE_CUDAGRAPH`` (even 0), ``-cc.cudagraph_mode`` and ``-cc.mode``.

The user's own env vars and ``vllm serve`` flags win: they enter the resolution
as env bindings, overrides and given features (:mod:`interlock.vllm.flags` reads
them; ``policy explain`` would show them) and pass through unchanged. vLLM still
adjusts some explicit values after reading them; the target profile below applies
those adjustments, so the decision printed is the one vLLM runs. An adjustment to a
value the user forced is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interlock.core.cudagraph import without_piecewise
from interlock.core.errors import PolicyError
from interlock.core.platform import TRITON_FACT
from interlock.policy.resolution import Resolution
from interlock.policy.trace import OVERRIDES
from interlock.vllm.flags import UserFlags
from interlock.vllm.version import binding_problems, check_known, knob, unsupported

RUNNER_KNOB = knob("VLLM_USE_V2_MODEL_RUNNER")
BREAKABLE_KNOB = knob("VLLM_USE_BREAKABLE_CUDAGRAPH")
RUNNER_ENV = RUNNER_KNOB.name
BREAKABLE_ENV = BREAKABLE_KNOB.name
#: interlock's runner names -> VLLM_USE_V2_MODEL_RUNNER, from the knob table.
RUNNER_VALUES = dict(RUNNER_KNOB.values)


@dataclass(frozen=True)
class Adjustment:
    field: str
    before: Any
    after: Any
    why: str


@dataclass(frozen=True)
class ServeCommand:
    resolution: Resolution
    #: The decision vLLM will run: the resolution after the target profile.
    decision: dict[str, Any]
    adjustments: tuple[Adjustment, ...]
    env: dict[str, str]
    argv: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "adjustments": [
                {"field": a.field, "from": a.before, "to": a.after, "why": a.why}
                for a in self.adjustments
            ],
            "env": self.env,
            "argv": self.argv,
            "resolution": self.resolution.to_dict(),
        }


def target_profile(
    values: Mapping[str, Any], pooling: bool, platform: str = ""
) -> tuple[dict[str, Any], list[Adjustment]]:
    """What vLLM makes of explicit settings after reading them (VllmConfig.__post_init__):
    breakable graphs run without compilation (the policy's implied stage already says so);
    without compilation and without breakable graphs, piecewise capture is impossible, so
    full_and_piecewise becomes full_decode_only and piecewise becomes none; pooling models
    are captured piecewise; on the CPU platform nothing is captured."""
    final = dict(values)
    adjustments = []
    if platform == "cpu" and final["cudagraph"] != "none":
        adjustments.append(
            Adjustment(
                "cudagraph",
                final["cudagraph"],
                "none",
                "vLLM's CPU platform captures no graphs (support_static_graph_mode() is "
                "false: cudagraph_mode becomes NONE)",
            )
        )
        final["cudagraph"] = "none"
        return final, adjustments
    if not final["compile"] and not final["breakable"]:
        lowered = without_piecewise(final["cudagraph"])
        if lowered != final["cudagraph"]:
            adjustments.append(
                Adjustment(
                    "cudagraph",
                    final["cudagraph"],
                    lowered,
                    "without torch.compile (and without breakable graphs) there are no "
                    "piecewise graphs (_normalize_piecewise_cudagraph_mode)",
                )
            )
            final["cudagraph"] = lowered
    if pooling and final["cudagraph"] != "piecewise":
        adjustments.append(
            Adjustment(
                "cudagraph",
                final["cudagraph"],
                "piecewise",
                "vLLM captures pooling models with piecewise graphs",
            )
        )
        final["cudagraph"] = "piecewise"
    return final, adjustments


def _known_triton(resolution: Resolution) -> tuple[bool, str] | None:
    """The context's ``has_triton`` where it speaks of the engine: given, or read from the
    engine's environment (not an assumption, nor interlock's own environment)."""
    context = resolution.context
    source = context.source(f"features.{TRITON_FACT}")
    if TRITON_FACT not in context.features:
        return None
    if source.startswith("given") or "engine" in source:
        return bool(context.features[TRITON_FACT]), source
    return None


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
    version: str | None = None,
    triton: tuple[bool, str] | None = None,
) -> ServeCommand:
    """The ``vllm serve`` command (argv and env additions) that runs ``resolution`` on vLLM
    ``version`` (None: unknown, every knob is set): only the env vars and flags that release
    reads (:data:`interlock.vllm.version.VLLM_KNOBS`); a decision it cannot run is refused.
    ``extra`` are flags for features given with ``--feature`` only. ``triton``: whether the
    engine has a Triton for its platform and how that is known (None: not known); Model
    Runner V2 without one is refused naming who chose it."""
    # The policy reads the variables this command sets: read otherwise than vLLM reads them,
    # the engine would run something other than what the policy decides from them.
    problems = binding_problems(resolution.policy.env)
    if problems:
        raise PolicyError("the policy's env bindings disagree with vLLM's knobs "
                          "(interlock/vllm/version.py VLLM_KNOBS): " + "; ".join(problems))
    values = resolution.decision.to_dict()
    # vLLM captures a pooling model piecewise whether --runner said so or its task is pooling.
    final, adjustments = target_profile(
        values, user.pooling or resolution.task == "pooling", resolution.context.platform
    )
    if triton is None:
        triton = _known_triton(resolution)
    if triton is not None and not triton[0] and final["runner"] == "mrv2":
        prov = resolution.provenance["runner"]
        who = "defaults" if prov.stage == "defaults" else f"{prov.stage} {prov.source}"
        where = f", {prov.location}" if prov.location else ""
        raise PolicyError(
            f"runner=mrv2 ({who}{where}) cannot run on this engine: Model Runner V2 requires "
            f"Triton, and it has none for {resolution.context.platform} ({triton[1]}); vLLM "
            "refuses it (\"Model Runner V2 requires Triton\"). Decide mrv1 here"
        )
    if version is not None:
        check_known(version)
    missing = unsupported(version, final)
    refused = [
        f"{why} (decided by {resolution.provenance[k.field].source})" for k, why in missing if why
    ]
    if refused:
        raise PolicyError("; ".join(refused))
    skipped = {k.name for k, _ in missing}
    for adj in adjustments:
        prov = resolution.provenance[adj.field]
        if prov.stage == OVERRIDES:
            raise PolicyError(
                f"vLLM would run {adj.field}={adj.after}, not the {adj.before} asked for with "
                f"{user.given_by.get(adj.field, 'an override')}: {adj.why}"
            )
    runner = final["runner"]
    if runner not in RUNNER_VALUES:
        raise PolicyError(
            f"the policy chose runner {runner!r} ({resolution.provenance['runner'].source}); "
            f"vLLM has {' and '.join(RUNNER_VALUES)} only"
        )
    env = {
        RUNNER_ENV: RUNNER_VALUES[runner],
        BREAKABLE_ENV: BREAKABLE_KNOB.text(bool(final["breakable"])),
    }
    env = {name: value for name, value in env.items() if name not in skipped}
    flags = []
    if "cudagraph" not in user.overrides and "-cc.cudagraph_mode" not in skipped:
        flags.append(f"-cc.cudagraph_mode={final['cudagraph'].upper()}")
    if "compile" not in user.overrides and "-cc.mode" not in skipped:
        flags.append(f"-cc.mode={'VLLM_COMPILE' if final['compile'] else 'NONE'}")
    sizes = final.get("capture_sizes")
    if sizes:
        flags.append(
            f"-cc.cudagraph_capture_sizes={json.dumps(list(sizes), separators=(',', ':'))}"
        )
    argv = ["vllm", "serve", model_argument(model), *flags, *extra, *user_args]
    return ServeCommand(resolution, final, tuple(adjustments), env, argv)

