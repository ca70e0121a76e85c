"""The one question every entry point asks the policy, and the one function that answers it.

A :class:`Query` is built once, where a request enters: the command line
(``interlock.commands.common.query_of``), ``LLM(...)`` (:meth:`Query.for_device`),
``policy serve`` and ``policy vllm`` (from their flags) and the vLLM plugin (from vLLM's
own config). :func:`decide_query` turns it into a :class:`Resolution`; what runs afterwards is
handed that resolution and the ``INTERLOCK_*`` settings read where the run started
(:class:`interlock.core.env.Settings`), never the command line or the process environment
again (``tests/app/test_environment_read_once.py``).

torch is imported only where a platform is detected or a device named
(``interlock.policy.context``, :meth:`Query.for_device`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from interlock.core.errors import InputError, PolicyError
from interlock.policy.context import (
    MODEL_CONFIG,
    PROCESS_ENV,
    Context,
    make_context,
    traits_from_config,
)
from interlock.policy.model import Policy

if TYPE_CHECKING:
    from interlock.plugins.registry import PluginRegistry
    from interlock.policy.resolution import EngineStage, Resolution

#: Who executes the decision: interlock's registered runner plugins (stage 5 asks them what
#: they serve), or vLLM's own model runners (which interlock's plugins do not describe).
Executor = Literal["interlock", "vllm"]


@dataclass(frozen=True)
class Query:
    """What is asked: the model (or a bare architecture), where it runs, what the caller
    gives (features, env binding values, engine versions, overrides) and where each given
    value came from (``sources``: ``features.X`` -> "given with --feature", ...)."""

    architecture: str | None = None
    #: What the policy reads of the model: ``demo``, a model directory or a config.json
    #: (:func:`model_target` makes one of a named model or a GGUF file), or None.
    model: str | None = None
    platform: str | None = None
    device_arch: str | None = None
    features: Mapping[str, Any] = field(default_factory=dict)
    #: The policy's env bindings' values: the builder merges the process environment and
    #: what was given, and says which in ``sources``.
    env: Mapping[str, str] = field(default_factory=dict)
    engine: Mapping[str, str] = field(default_factory=dict)
    model_id: str | None = None
    #: Facts about the model given by the caller (vLLM's ``--runner`` names its task).
    traits: Mapping[str, Any] | None = None
    #: Decision fields forced by the caller (field -> typed value).
    overrides: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    #: A run's split across ranks: the ``tensor_parallel_size`` feature, from one place, and
    #: how the caller said it (``--tensor-parallel-size 2``).
    tensor_parallel_size: int | None = None
    tensor_parallel_given: str = ""
    #: The model runs on this machine: a given platform must be this machine's.
    runs_here: bool = False
    executed_by: Executor = "interlock"
    #: The engine stage of the engine release the decision is handed to (for vLLM,
    #: ``interlock.vllm.stage.ReleaseStage``): the resolution is then what that release runs.
    stage: EngineStage | None = None

    @classmethod
    def for_device(
        cls, policy: Policy, model: str, device: str | None, overrides: Mapping[str, Any],
        tensor_parallel_size: int,
    ) -> Query:
        """``LLM``'s query: the process environment's bindings; the platform the given torch
        device's (Triton probed: this machine runs it), else detected."""
        import torch

        from interlock.core.platform import TRITON_FACT, platform_named_by_device
        from interlock.policy.context import has_triton_fact

        env, sources = process_env(policy)
        features: dict[str, Any] = {}
        platform = None
        # cuda is detected: the device cannot tell CUDA from ROCm
        if device is not None and (named := platform_named_by_device(torch.device(device).type)):
            platform = named
            sources["platform"] = f"given (device={device!r})"
            features[TRITON_FACT], sources[f"features.{TRITON_FACT}"] = has_triton_fact(True)
        return cls(model=model, platform=platform, features=features, env=env,
                   overrides=dict(overrides), sources=sources,
                   tensor_parallel_size=tensor_parallel_size,
                   tensor_parallel_given=f"tensor_parallel_size={tensor_parallel_size}")

    def context(self) -> Context:
        """The policy's context: the model's architecture and traits read from its config
        (``architecture``, when given too, must agree), the platform detected when not
        given."""
        from interlock.plugins.capabilities import TENSOR_PARALLEL

        features, sources = dict(self.features), dict(self.sources)
        if self.tensor_parallel_size is not None:
            key, how = f"features.{TENSOR_PARALLEL}", self.tensor_parallel_given
            given = features.get(TENSOR_PARALLEL, self.tensor_parallel_size)
            if given != self.tensor_parallel_size:
                raise InputError(
                    f"{TENSOR_PARALLEL}={given} ({sources.get(key, 'given')}) disagrees with "
                    f"{how}; the model is split as {how} says, so give that alone"
                )
            features[TENSOR_PARALLEL] = self.tensor_parallel_size
            sources[key] = f"given ({how})"
        common: dict[str, Any] = dict(
            platform=self.platform, device_arch=self.device_arch, features=features,
            env=dict(self.env), sources=sources, engine=dict(self.engine),
            model_id=self.model_id, traits=self.traits,
        )
        if self.model is None:  # `policy explain ARCH`: nothing of the runners is imported
            return make_context(self.architecture, **common)
        from interlock.runners.model.sources import DEMO

        if self.model != DEMO:
            return make_context(self.architecture, model=self.model, **common)
        return _demo_context(self.architecture, common)


def _demo_context(architecture: str | None, common: dict[str, Any]) -> Context:
    """The built-in model's context: its config is code, not a file."""
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


def decide_query(
    policy: Policy, query: Query, *, refused: bool = False,
    plugins: PluginRegistry | None = None,
) -> Resolution:
    """The decision for ``query`` under ``policy``, with the capabilities of the registered
    runner plugins (``plugins``; None: the process's) when interlock's runners run it. A
    caller deciding after the run started passes the registry of the settings it read there.
    Raises ``PolicyError``
    (``CapabilityError`` when something forced is unsupported, ``PolicyRefused`` where a
    rule refuses the context unless ``refused`` asks for the refused resolution back)."""
    if query.runs_here:
        check_runs_here(query.platform)
    return decide_context(policy, query.context(), query.overrides, executed_by=query.executed_by,
                          stage=query.stage, refused=refused, plugins=plugins)


def decide_context(
    policy: Policy, context: Context, overrides: Mapping[str, Any] | None = None, *,
    executed_by: Executor = "interlock", stage: EngineStage | None = None, refused: bool = False,
    plugins: PluginRegistry | None = None,
) -> Resolution:
    """The one decision every reader makes of a context built by
    :func:`~interlock.policy.context.make_context` (a :class:`Query`'s, a table row's, a
    replayed record's, a policy test case's): stage 5 asks the registered runner plugins
    when interlock's runners run it (``executed_by``), ``stage`` is the engine stage of the
    release the decision is handed to, ``plugins`` the registry stage 5 asks (None: the
    process's)."""
    from interlock.plugins.capabilities import capabilities_for
    from interlock.policy.resolution import resolve

    capabilities = capabilities_for(policy, plugins) if executed_by == "interlock" else None
    return resolve(policy, context, overrides, capabilities=capabilities,
                   refused=refused, engine=stage)


def process_env(
    policy: Policy, environ: Mapping[str, str] | None = None, source: str = PROCESS_ENV
) -> tuple[dict[str, str], dict[str, str]]:
    """``(env, sources)``: the values an environment (this process's unless ``environ``)
    gives the policy's bindings, each from ``source``."""
    environ = os.environ if environ is None else environ
    env = {name: environ[name] for name in policy.env if name in environ}
    return env, {f"env.{name}": source for name in env}


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
