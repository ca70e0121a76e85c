"""Deciding how to run one model on this machine: the resolution `policy run` and
``interlock.llm.LLM`` share, and the line naming who chose each field it acts on.

torch is imported only where the platform is detected (``interlock.policy.context``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from interlock.core.errors import PolicyError
from interlock.core.fields import show_scalar
from interlock.policy.context import (
    MODEL_CONFIG,
    PROCESS_ENV,
    Context,
    make_context,
    traits_from_config,
)
from interlock.policy.model import Policy
from interlock.policy.trace import Provenance

if TYPE_CHECKING:
    from interlock.core.decision import Decision
    from interlock.policy.resolution import Resolution

#: Each decision field a run acts on, in the order the log line names them.
LOGGED_FIELDS = ("runner", "cudagraph", "breakable")
GIVEN_BY_CALLER = "given by the caller"


def resolve_model_run(
    policy: Policy,
    model: str | os.PathLike[str],
    overrides: Mapping[str, Any] | None = None,
    *,
    platform: str | None = None,
    device_arch: str | None = None,
    features: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    sources: Mapping[str, str] | None = None,
    engine: Mapping[str, str] | None = None,
    model_id: str | None = None,
) -> Resolution:
    """The decision for running ``model`` (a model directory, a named model, a GGUF file,
    or ``demo``: the built-in model) under ``policy``, for its architecture and
    config-derived traits, with the capabilities of the registered runner plugins. The
    keywords are ``make_context``'s (platform detected when None). Raises ``PolicyError``
    (``CapabilityError`` when something forced is unsupported)."""
    from interlock.plugins.capabilities import capability_stage
    from interlock.policy.resolution import resolve

    context = model_context(
        model, platform=platform, device_arch=device_arch, features=features, env=env,
        sources=sources, engine=engine, model_id=model_id,
    )
    return resolve(policy, context, overrides, capabilities=capability_stage())


def resolve_for_device(
    model: str | os.PathLike[str],
    device: str | None,
    policy_paths: Sequence[str | os.PathLike[str]] | None,
    overrides: Mapping[str, Any] | None,
    tensor_parallel_size: int,
) -> Resolution:
    """``LLM``'s decision for ``model``: under the layered policy (``policy_paths``, else
    ``$INTERLOCK_POLICY``, else the shipped one) with the process environment's bindings; the
    platform is the given torch device's, else detected; the run's tensor_parallel_size is a
    given feature."""
    import torch

    from interlock.core.platform import TRITON_FACT, platform_named_by_device
    from interlock.plugins.capabilities import TENSOR_PARALLEL
    from interlock.policy.context import has_triton_fact
    from interlock.policy.loader import load_policy

    policy = load_policy(policy_paths)
    env, sources = process_env(policy)
    platform = None
    features: dict[str, Any] = {TENSOR_PARALLEL: tensor_parallel_size}
    sources[f"features.{TENSOR_PARALLEL}"] = (
        f"given (tensor_parallel_size={tensor_parallel_size})"
    )
    # cuda is detected: the device cannot tell CUDA from ROCm
    if device is not None and (named := platform_named_by_device(torch.device(device).type)):
        platform = named
        sources["platform"] = f"given (device={device!r})"
        # This machine runs it, so Triton is probed, not assumed as for a named platform.
        features[TRITON_FACT], sources[f"features.{TRITON_FACT}"] = has_triton_fact(True)
    return resolve_model_run(
        policy, model, overrides, platform=platform, features=features, env=env, sources=sources
    )


def process_env(policy: Policy) -> tuple[dict[str, str], dict[str, str]]:
    """``(env, sources)``: the values the process environment gives the policy's bindings."""
    env = {name: os.environ[name] for name in policy.env if name in os.environ}
    return env, {f"env.{name}": PROCESS_ENV for name in env}


def check_runs_here(platform: str | None) -> None:
    """A run happens here: a given ``platform`` may only name this machine's."""
    from interlock.core.platform import detect_platform

    here = detect_platform()[0]
    if platform is not None and platform != here:
        raise PolicyError(
            f"--platform {platform}: this command runs the model on this machine, which is "
            f"{here}; use `policy explain` to see the decision for another platform"
        )


def detected_device() -> str:
    """The torch device type of the platform this process sees."""
    from interlock.core.platform import detect_platform, device_for

    return device_for(detect_platform()[0])


def decided_by(resolution: Resolution) -> str:
    """``runner=mrv2 (defaults, policies.yaml:59), ...``: each field with who chose it."""
    decision = resolution.decision.to_dict()
    return decision_line(
        {name: decision[name] for name in LOGGED_FIELDS},
        {name: _chooser(resolution.provenance[name]) for name in LOGGED_FIELDS},
    )


def decision_line(values: Mapping[str, Any], choosers: Mapping[str, str]) -> str:
    """The one format of that line: ``name=value (who chose it)`` per logged field."""
    return ", ".join(
        f"{name}={show_scalar(values[name])} ({choosers[name]})" for name in LOGGED_FIELDS
    )


def given_by_caller(decision: Decision) -> str:
    """That line for a decision the caller gave: every field chosen by the caller."""
    values = {name: getattr(decision, name) for name in LOGGED_FIELDS}
    return decision_line(values, dict.fromkeys(LOGGED_FIELDS, GIVEN_BY_CALLER))


def _chooser(prov: Provenance) -> str:
    who = "defaults" if prov.stage == "defaults" else f"{prov.stage} {prov.source}"
    return f"{who}, {prov.location}" if prov.location else who


def model_target(model: str | os.PathLike[str]) -> str:
    """What the policy and the runners read for ``model``: ``demo``, or the model directory
    (``runners.model.sources.model_directory``: a named model's or a GGUF file's conversion,
    made on first use). A named model or GGUF file that cannot be resolved is a
    ``PolicyError`` saying why; a name of no accepted form, an ``UnknownModel``."""
    from interlock.runners.model.source_error import ModelSourceError
    from interlock.runners.model.sources import DEMO, model_directory

    try:
        directory = model_directory(model)
    except ModelSourceError as exc:
        raise PolicyError(str(exc)) from None
    return DEMO if directory is None else str(directory)


def model_context(
    model: str | os.PathLike[str], architecture: str | None = None, **common: Any
) -> Context:
    """The context of running ``model``: its architecture and traits (``architecture``, when
    given, must agree), and ``common`` (``make_context``'s keywords)."""
    from interlock.runners.model.sources import DEMO

    target = model_target(model)
    if target != DEMO:
        return make_context(architecture, model=target, **common)
    from interlock.runners.model.demo import DEMO_CONFIG

    demo_architecture = DEMO_CONFIG["architectures"][0]
    if architecture not in (None, demo_architecture):
        raise PolicyError(
            f"architecture {architecture!r} disagrees with the demo model's {demo_architecture!r}"
        )
    context = make_context(demo_architecture, **common)
    traits = traits_from_config(DEMO_CONFIG)
    facts = {f"traits.{name}": f"{MODEL_CONFIG} ({note})" for name, (_, note) in traits.items()}
    return replace(
        context,
        model_traits={name: value for name, (value, _) in traits.items()},
        sources={**context.sources, "architecture": f"{MODEL_CONFIG} (demo model)", **facts},
    )
