"""interlock inside vLLM: the policy as the source of vLLM's runner and graph defaults.

Installed into a vLLM environment, interlock registers ``interlock`` in the entry-point
group ``vllm.general_plugins``; vLLM calls :func:`register` in every process it starts,
before it builds its config. :func:`register` wraps the seam where vLLM applies its own
per-architecture config hooks, the first step of ``VllmConfig.__post_init__`` (see
:data:`SEAMS`): there the model is known and none of vLLM's defaults (optimization level,
platform, compilation mode) has been filled yet. The wrapper resolves the policy for that
model on the engine's own platform, with the engine's own Triton verdict, and sets only
what the user left unset: ``VLLM_USE_V2_MODEL_RUNNER`` and ``VLLM_USE_BREAKABLE_CUDAGRAPH``
when absent from the environment, ``compilation_config.cudagraph_mode`` and ``.mode`` when
``None``. It logs one line per decided field with the rule and ``file:line`` that chose
it, and appends a decision record when a decision log is configured
(``$INTERLOCK_DECISION_LOG``). A decision the engine cannot honour (Model Runner V2
without Triton, CUDA graphs on a platform without them) stops the engine naming the rule;
so does any failure of the plugin itself: vLLM logs and ignores an entry point that fails
to load, so a failure here exits rather than leave the engine running ungoverned.

The decision is also exported on ``/metrics`` by :mod:`interlock.vllm.plugin.metrics`
(entry-point group ``vllm.stat_logger_plugins``). Everything that does not need vLLM is
here and testable without it (:func:`decide`); the adapter reads vLLM's objects.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from interlock.core.errors import EXIT_CODES, PolicyError, error_kind
from interlock.core.platform import TRITON_FACT
from interlock.vllm.engine import compile_mode_name
from interlock.vllm.version import knob

#: Where each vLLM release applies its per-architecture config hooks first in
#: ``VllmConfig.__post_init__`` (read in the wheels): the method the plugin wraps.
SEAMS: Mapping[str, str] = {
    "0.30.0": "vllm/config/vllm.py:2530, called at :1265 of __post_init__ (:1254)",
    "0.31.0": "vllm/config/vllm.py:2766, called at :1434 of __post_init__ (:1405)",
    "0.32.0": "vllm/config/vllm.py:2629, called at :1443 of __post_init__ (:1414)",
    "0.33.0": "vllm/config/vllm.py:2735, called at :1539 of __post_init__ (:1510)",
}
SEAM_METHOD = "try_verify_and_update_config"
#: What the engine logs through: vLLM's own logger tree, so the lines carry its format.
LOGGER = "vllm.interlock"
#: Who a decision record names as the resolver.
RECORD_COMMAND = "vllm plugin"
#: A line the plugin logs first once it governs a config: `policy vllm verify` and the
#: startup-log check look for it.
ACTIVE_PREFIX = "interlock: governing "
FIELD_PREFIX = "interlock: decided "

RUNNER_ENV = knob("VLLM_USE_V2_MODEL_RUNNER").name
BREAKABLE_ENV = knob("VLLM_USE_BREAKABLE_CUDAGRAPH").name
_logger = logging.getLogger(LOGGER)


class PluginRefusal(PolicyError):
    """A decision this engine cannot run, or a failure of the plugin: the engine stops."""


@dataclass(frozen=True)
class EngineFacts:
    """What the engine knows that the policy reads, taken from vLLM's own objects."""

    architecture: str
    platform: str
    device_arch: str
    vllm_version: str
    #: vLLM's own verdict (``vllm.triton_utils.HAS_TRITON``) and where it came from.
    has_triton: bool
    triton_source: str
    #: Whether the platform captures graphs at all (``support_static_graph_mode()``).
    static_graphs: bool
    #: A local model directory (its config.json is read) or None (a hub id, a GGUF file).
    model_dir: str | None = None
    model_id: str | None = None
    features: Mapping[str, Any] = field(default_factory=dict)
    #: Decision fields the user set on vLLM's config: field -> (value, how it was given).
    user_set: Mapping[str, tuple[Any, str]] = field(default_factory=dict)
    #: The optimization level when the user changed it from vLLM's default (O2).
    level: int | None = None


@dataclass(frozen=True)
class Setting:
    """One decided field and how it reaches vLLM."""

    name: str
    value: Any
    chooser: str
    #: What is set in vLLM (``VLLM_USE_V2_MODEL_RUNNER=0``), or None when the user's stays.
    target: str | None
    given_by: str | None = None

    def line(self) -> str:
        shown = str(self.value).lower() if isinstance(self.value, bool) else str(self.value)
        if self.given_by is not None:
            return f"{FIELD_PREFIX}{self.name}={shown} (given: {self.given_by}; left as is)"
        return f"{FIELD_PREFIX}{self.name}={shown} ({self.chooser}) -> {self.target}"


@dataclass(frozen=True)
class PluginDecision:
    resolution: Any
    #: The decision vLLM will run (after vLLM's own adjustments), as ``policy vllm`` has it.
    decision: dict[str, Any]
    #: Env vars to set when absent.
    env: dict[str, str]
    #: compilation_config fields to set when None: ``cudagraph_mode`` / ``mode`` -> NAME.
    compilation: dict[str, str]
    settings: tuple[Setting, ...]
    header: str

    def rule_ids(self) -> str:
        """The rules (or ``defaults``) that decided, in field order, without repeats."""
        seen = [s.chooser.split(",")[0].removeprefix("rules ") for s in self.settings]
        return ",".join(dict.fromkeys(seen))


def decide(facts: EngineFacts, policy: Any, environ: Mapping[str, str]) -> PluginDecision:
    """The policy's decision for the model vLLM is loading, what to set in vLLM for it, and
    the lines to log; a decision the engine cannot run raises :class:`PluginRefusal` naming
    the rule that made it."""
    from interlock.app.decided_by import chooser as provenance_chooser
    from interlock.app.query import Query, decide, process_env
    from interlock.vllm.command import serve_command
    from interlock.vllm.flags import UserFlags, level_overrides

    env, sources = process_env(policy, environ, "process environment of the vLLM engine")
    sources["platform"] = "vLLM's current_platform"
    sources["device_arch"] = "vLLM's current_platform"
    sources[f"features.{TRITON_FACT}"] = facts.triton_source
    sources["engine.vllm"] = "the running vLLM (vllm.__version__)"
    sources.update({f"features.{k}": "vLLM's engine config" for k in facts.features})
    if facts.model_id is not None:
        sources["model_id"] = "vLLM's model_config.model"
    overrides = {name: value for name, (value, _) in facts.user_set.items()}
    given_by = {name: how for name, (_, how) in facts.user_set.items()}
    query = Query(
        architecture=None if facts.model_dir else facts.architecture,
        model=facts.model_dir,
        platform=facts.platform,
        device_arch=facts.device_arch,
        features={**facts.features, TRITON_FACT: facts.has_triton},
        env=env,
        sources=sources,
        model_id=facts.model_id,
        engine={"vllm": facts.vllm_version},
        overrides=dict(overrides),
        runners="vllm",
    )
    user = UserFlags(overrides=dict(overrides), given_by=dict(given_by), level=facts.level,
                     level_flag=f"-O{facts.level}" if facts.level is not None else "")
    resolution = decide(policy, query)
    by_level = level_overrides(resolution, user)
    if by_level:
        overrides.update(by_level)
        user.overrides.update(by_level)
        resolution = decide(policy, replace(query, overrides=dict(overrides)))
    try:
        command = serve_command(resolution, facts.model_dir or facts.architecture, [], user,
                                version=facts.vllm_version,
                                triton=(facts.has_triton, facts.triton_source))
    except PolicyError as exc:
        raise PluginRefusal(str(exc)) from None
    final = command.decision
    prov = resolution.provenance

    def chooser(name: str) -> str:
        return provenance_chooser(prov[name])

    if final["cudagraph"] != "none" and not facts.static_graphs:
        raise PluginRefusal(
            f"cudagraph={final['cudagraph']} ({chooser('cudagraph')}) cannot run here: vLLM's "
            f"{facts.platform} platform captures no graphs and would switch to NONE"
        )
    settings = []
    out_env: dict[str, str] = {}
    for name, var in (("runner", RUNNER_ENV), ("breakable", BREAKABLE_ENV)):
        if var in environ:
            settings.append(Setting(name, final[name], chooser(name), None,
                                    f"{var}={environ[var]} in the environment"))
        elif var in command.env:
            out_env[var] = command.env[var]
            settings.append(Setting(name, final[name], chooser(name), f"{var}={out_env[var]}"))
    compilation: dict[str, str] = {}
    for name, key, value in (
        ("cudagraph", "cudagraph_mode", str(final["cudagraph"]).upper()),
        ("compile", "mode", "VLLM_COMPILE" if final["compile"] else "NONE"),
    ):
        if name in facts.user_set:
            settings.append(Setting(name, final[name], chooser(name), None, given_by[name]))
            continue
        compilation[key] = value
        ran = compile_mode_name(final["compile"], facts.platform) if key == "mode" else value
        also = f" (vLLM runs it as {ran} on {facts.platform})" if ran != value else ""
        settings.append(
            Setting(name, final[name], chooser(name), f"compilation_config.{key}={value}{also}")
        )
    files = ",".join(f.path for f in policy.files)
    header = (
        f"{ACTIVE_PREFIX}{resolution.context.architecture} on {facts.platform}"
        f"{' ' + facts.device_arch if facts.device_arch else ''}, vLLM {facts.vllm_version}, "
        f"{TRITON_FACT}={'true' if facts.has_triton else 'false'} ({facts.triton_source}); "
        f"policy {policy.version} revision {policy.revision} from {files}"
    )
    return PluginDecision(resolution, dict(final), out_env, compilation, tuple(settings), header)


#: The decision this process applied (the stat logger reads it), and the env vars it set.
APPLIED: list[PluginDecision] = []


def register() -> None:
    """The ``vllm.general_plugins`` entry point: wrap the seam. Any failure stops the
    process: vLLM would otherwise run without the policy."""
    try:
        _install()
    except BaseException as exc:  # noqa: BLE001 - every failure must stop the engine
        _stop(exc)


def _stop(exc: BaseException) -> None:
    """Log the one line, write it to stderr, and exit with interlock's documented code: 5
    for a rule's refusal, 1 for a policy error, a decision log it cannot write or a decision
    the engine cannot run (interlock's errors for the user, named by their message alone), 3
    for any other failure of the plugin."""
    if isinstance(exc, SystemExit):
        raise exc
    text = str(exc) if error_kind(exc) else f"{type(exc).__name__}: {exc}"
    message = f"interlock: the vLLM plugin stops the engine: {text}"
    _logger.error("%s", message)
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CODES[error_kind(exc) or "plugin"])


def _install() -> None:
    from vllm.config import vllm as config_vllm

    cls = config_vllm.VllmConfig
    original = getattr(cls, SEAM_METHOD, None)
    if original is None:
        import vllm

        raise PluginRefusal(
            f"vLLM {getattr(vllm, '__version__', '?')} has no VllmConfig.{SEAM_METHOD}, the "
            f"seam interlock governs through (read for {', '.join(SEAMS)}); this release is "
            "not supported by the plugin"
        )
    if getattr(original, "_interlock", False):
        return  # registered twice in one process

    def governed(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _govern(self)
        except BaseException as exc:  # noqa: BLE001 - see register()
            _stop(exc)
        return original(self, *args, **kwargs)

    governed._interlock = True  # type: ignore[attr-defined]
    setattr(cls, SEAM_METHOD, governed)


def _govern(config: Any) -> None:
    model_config = config.model_config
    if model_config is None or getattr(model_config, "_interlock_governed", False):
        return
    if getattr(model_config, "config_updated", False):
        return  # vLLM has applied its hooks already: this view was governed before
    from interlock.policy.loader import load_policy

    facts = engine_facts(config)
    policy = load_policy(None)
    environ = {k: v for k, v in os.environ.items() if k not in _set_here}
    made = decide(facts, policy, environ)
    apply(config, made)
    model_config._interlock_governed = True
    APPLIED.append(made)
    _record(made, facts)


#: Env vars this process set (so a second config in it does not take them for the user's).
_set_here: set[str] = set()


def apply(config: Any, made: PluginDecision) -> None:
    """Set what was decided on vLLM's config and environment (only what is unset), and log
    one line per field."""
    from vllm.config import CompilationMode, CUDAGraphMode

    for name, value in made.env.items():
        if name not in os.environ:
            os.environ[name] = value
            _set_here.add(name)
    compilation = config.compilation_config
    kinds: dict[str, Callable[[str], Any]] = {
        "cudagraph_mode": lambda name: CUDAGraphMode[name],
        "mode": lambda name: CompilationMode[name],
    }
    for key, name in made.compilation.items():
        if getattr(compilation, key) is None:
            setattr(compilation, key, kinds[key](name))
    _logger.info("%s", made.header)
    for setting in made.settings:
        _logger.info("%s", setting.line())


def engine_facts(config: Any) -> EngineFacts:
    """Read the facts the policy needs from vLLM's config and platform."""
    import vllm
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    from interlock.core.platform import PLATFORMS

    model_config = config.model_config
    architecture = model_config.architecture
    if not architecture:
        raise PluginRefusal("vLLM's model config names no architecture")
    platform = "rocm" if current_platform.is_rocm() else str(current_platform.device_type)
    if platform not in PLATFORMS:
        raise PluginRefusal(
            f"vLLM runs on platform {platform!r}, which interlock does not know "
            f"({', '.join(PLATFORMS)})"
        )
    device_arch = ""
    if platform == "cuda":
        capability = current_platform.get_device_capability()
        device_arch = f"sm_{capability.major}{capability.minor}" if capability else ""
    elif platform == "rocm":
        import torch

        device_arch = str(torch.cuda.get_device_properties(0).gcnArchName).split(":")[0]
    model = str(model_config.model)
    model_dir = model if os.path.isfile(os.path.join(model, "config.json")) else None
    parallel = config.parallel_config
    features: dict[str, Any] = {
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "pipeline_parallel_size": parallel.pipeline_parallel_size,
        "data_parallel_size": parallel.data_parallel_size,
        "enforce_eager": bool(model_config.enforce_eager),
    }
    if model_config.quantization:
        features["quantization"] = str(model_config.quantization)
    user_set: dict[str, tuple[Any, str]] = {}
    compilation = config.compilation_config
    if compilation.cudagraph_mode is not None:
        user_set["cudagraph"] = (compilation.cudagraph_mode.name.lower(),
                                 f"compilation_config.cudagraph_mode="
                                 f"{compilation.cudagraph_mode.name}")
    if compilation.mode is not None:
        user_set["compile"] = (compilation.mode.name != "NONE",
                               f"compilation_config.mode={compilation.mode.name}")
    level = int(config.optimization_level)
    from packaging.version import Version

    return EngineFacts(
        architecture=architecture,
        platform=platform,
        device_arch=device_arch,
        vllm_version=Version(vllm.__version__).public,
        has_triton=bool(HAS_TRITON),
        triton_source="detected by the engine (vllm.triton_utils.HAS_TRITON)",
        static_graphs=bool(current_platform.support_static_graph_mode()),
        model_dir=model_dir,
        model_id=None if model_dir else model,
        features=features,
        user_set=user_set,
        level=None if level == 2 else level,
    )


def _record(made: PluginDecision, facts: EngineFacts) -> None:
    from interlock import decision_log

    path = decision_log.log_path(None)
    if path is None:
        return
    engine = {"name": "vllm", "env": made.env, "compilation_config": made.compilation,
              "target": made.decision, "vllm_version": facts.vllm_version,
              "plugin": "interlock (vllm.general_plugins)"}
    overrides = {name: value for name, (value, _) in facts.user_set.items()}
    decision_log.write(
        path, made.resolution, RECORD_COMMAND, model=facts.model_dir or facts.model_id or
        facts.architecture, capabilities=False, overrides=overrides,
        runner={"name": made.decision["runner"], "plugin": None, "distribution": "vllm",
                "version": facts.vllm_version},
        engine=engine,
    )
