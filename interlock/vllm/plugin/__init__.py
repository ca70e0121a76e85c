"""interlock inside vLLM: the policy as the source of vLLM's runner and graph defaults.

Installed into a vLLM environment, interlock registers ``interlock`` in the entry-point
group ``vllm.general_plugins``; vLLM calls :func:`register` in every process it starts,
before it builds its config. :func:`register` refuses a vLLM release interlock has not read
(:mod:`interlock.vllm.releases`; exit 5): what an unread release does with the decision is
not known, so the plugin does not govern it blind. Otherwise it wraps the seam where that
release applies its own per-architecture config hooks, the first step of
``VllmConfig.__post_init__`` (the release's ``seam``): there the model is known and none of
vLLM's defaults (optimization level, platform, compilation mode) has been filled yet. The
wrapper resolves the policy for that model on the engine's own platform, with the engine's
own Triton verdict, through the release's engine stage (:mod:`interlock.vllm.stage`: what
that release makes of the decision, what it refuses), and sets only what the user left
unset and the release reads: ``VLLM_USE_V2_MODEL_RUNNER`` (until 0.33) and
``VLLM_USE_BREAKABLE_CUDAGRAPH`` when absent from the environment,
``compilation_config.cudagraph_mode`` and ``.mode`` when ``None``. It logs one line per
decided field with the rule and ``file:line`` that chose it, and appends a decision record
when a decision log is configured (``$INTERLOCK_DECISION_LOG``). When ``__post_init__``
ends it reads vLLM's final config back (graph mode, compilation mode, the breakable verdict
where the release keeps it, the runner where knowable) and stops the engine on any field a
later step of vLLM changed (:func:`read_back`). A decision the engine cannot honour stops the
engine naming the rule; so does any failure of the plugin itself: vLLM logs and ignores an
entry point that fails to load, so a failure here exits rather than leave the engine running
ungoverned.

The decision is also exported on ``/metrics`` by :mod:`interlock.vllm.plugin.metrics`
(entry-point group ``vllm.stat_logger_plugins``). Everything that does not need vLLM is
here and testable without it (:func:`plugin_decision`); the adapter reads vLLM's objects.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from interlock.app.engine_stop import stop_engine
from interlock.core.env import Settings
from interlock.core.errors import LocatedError, PolicyError
from interlock.core.platform import TRITON_FACT
from interlock.vllm.releases import (
    BREAKABLE_KNOB,
    CONFIG_VERDICT,
    CPU_ARCH,
    RELEASES,
    RUNNER_KNOB,
    Release,
    cpu_arch_name,
    release,
)
from interlock.vllm.startup_log import compile_mode_name

#: The method of ``VllmConfig`` each release's seam is (``Release.seam``).
SEAM_METHOD = "try_verify_and_update_config"
#: What the engine logs through: vLLM's own logger tree, so the lines carry its format.
LOGGER = "vllm.interlock"
#: Who a decision record names as the resolver.
RECORD_COMMAND = "vllm plugin"
#: A line the plugin logs first once it governs a config: `policy vllm verify` and the
#: startup-log check look for it.
ACTIVE_PREFIX = "interlock: governing "
FIELD_PREFIX = "interlock: decided "

RUNNER_ENV = RUNNER_KNOB.name
BREAKABLE_ENV = BREAKABLE_KNOB.name
_logger = logging.getLogger(LOGGER)


class PluginRefusal(LocatedError):
    """A decision this engine cannot run, or a failure of the plugin: the engine stops (exit
    1, as for input the engine was given)."""


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
    release: Release
    #: Env vars to set when absent.
    env: dict[str, str]
    #: compilation_config fields to set when None: ``cudagraph_mode`` / ``mode`` -> NAME.
    compilation: dict[str, str]
    settings: tuple[Setting, ...]
    header: str
    #: Lines logged as warnings: the policy's release does not cover this vLLM.
    warnings: tuple[str, ...] = ()

    @property
    def decision(self) -> dict[str, Any]:
        """The decision vLLM will run: the resolution's, the release's stage included."""
        return dict(self.resolution.decision.to_dict())

    def rule_ids(self) -> str:
        """The rules (or ``defaults``) that decided, in field order, without repeats."""
        seen = [s.chooser.split(",")[0].removeprefix("rules ") for s in self.settings]
        return ",".join(dict.fromkeys(seen))


def plugin_decision(facts: EngineFacts, policy: Any, environ: Mapping[str, str]) -> PluginDecision:
    """The policy's decision for the model vLLM is loading, what to set in vLLM for it, and
    the lines to log; a decision the engine cannot run raises :class:`PluginRefusal` naming
    the rule that made it."""
    from interlock.app.decided_by import chooser as provenance_chooser
    from interlock.app.query import Query, decide_query, process_env
    from interlock.vllm.command import serve_command
    from interlock.vllm.flags import UserFlags
    from interlock.vllm.stage import LEVEL_FEATURE, ReleaseStage

    env, sources = process_env(policy, environ, "process environment of the vLLM engine")
    sources["platform"] = "vLLM's current_platform"
    sources["device_arch"] = "vLLM's current_platform"
    sources[f"features.{TRITON_FACT}"] = facts.triton_source
    sources["engine.vllm"] = "the running vLLM (vllm.__version__)"
    sources.update({f"features.{k}": "vLLM's engine config" for k in facts.features})
    if facts.model_id is not None:
        sources["model_id"] = "vLLM's model_config.model"
    rel = release(facts.vllm_version)
    overrides = {name: value for name, (value, _) in facts.user_set.items()}
    given_by = {name: how for name, (_, how) in facts.user_set.items()}
    features = {**facts.features, TRITON_FACT: facts.has_triton}
    if facts.level is not None:
        features[LEVEL_FEATURE] = facts.level
        sources[f"features.{LEVEL_FEATURE}"] = f"vLLM's optimization_level (-O{facts.level})"
    query = Query(
        architecture=None if facts.model_dir else facts.architecture,
        model=facts.model_dir,
        platform=facts.platform,
        device_arch=facts.device_arch,
        features=features,
        env=env,
        sources=sources,
        model_id=facts.model_id,
        engine={"vllm": facts.vllm_version},
        overrides=dict(overrides),
        executed_by="vllm",
        stage=ReleaseStage(rel.version),
    )
    user = UserFlags(overrides=dict(overrides), given_by=dict(given_by), level=facts.level,
                     level_flag=f"-O{facts.level}" if facts.level is not None else "")
    resolution = decide_query(policy, query)
    try:
        command = serve_command(resolution, facts.model_dir or facts.architecture, [], user,
                                release=rel)
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
        else:
            settings.append(Setting(name, final[name], chooser(name),
                                    f"nothing to set (vLLM {rel.version} reads no {var})"))
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
    from interlock.policy.release import mismatch
    from interlock.vllm.releases import use_instead

    problem = mismatch(policy, facts.vllm_version, "the running vLLM")
    warnings = () if problem is None else (
        f"interlock: WARNING: {problem}: the defaults applied are that release's, passed "
        f"through vLLM {rel.version}'s own stage; {use_instead(facts.vllm_version)}",)
    return PluginDecision(resolution, rel, out_env, compilation, tuple(settings), header,
                          warnings)


#: The decision this process applied (the stat logger reads it), and the env vars it set.
APPLIED: list[PluginDecision] = []


def register() -> None:
    """The ``vllm.general_plugins`` entry point: wrap the seam. Any failure stops the
    process: vLLM would otherwise run without the policy."""
    try:
        _install()
    except BaseException as exc:  # noqa: BLE001 - every failure must stop the engine
        _stop(exc)


def _stop(exc: BaseException) -> NoReturn:
    stop_engine(exc, "vLLM", _logger)


def governed_release(version: str) -> Release:
    """The release the plugin governs ``version`` as: one interlock has read, seam included
    (:class:`~interlock.vllm.releases.UnknownRelease`, exit 5, for a release not read)."""
    rel = release(version)
    if rel.seam is None:
        seamed = ", ".join(r.version for r in RELEASES if r.seam is not None)
        raise PluginRefusal(
            f"vLLM {rel.version}'s config seam ({SEAM_METHOD}) was not read by interlock (the "
            f"plugin governs {seamed}): use `policy vllm args|serve`, or a vLLM the plugin knows"
        )
    return rel


def _install() -> None:
    import vllm
    from packaging.version import Version

    rel = governed_release(Version(vllm.__version__).public)
    from vllm.config import vllm as config_vllm

    cls = config_vllm.VllmConfig
    original = getattr(cls, SEAM_METHOD, None)
    if original is None:
        raise PluginRefusal(
            f"vLLM {rel.version} has no VllmConfig.{SEAM_METHOD}, the seam interlock governs "
            f"through ({rel.seam}): this install differs from the release interlock read"
        )
    if getattr(original, "_interlock", False):
        return  # registered twice in one process
    post_init = cls.__post_init__

    def governed(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _govern(self)
        except BaseException as exc:  # noqa: BLE001 - see register()
            _stop(exc)
        return original(self, *args, **kwargs)

    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = post_init(self, *args, **kwargs)
        made = getattr(self.model_config, "_interlock_made", None)
        if made is not None:
            try:
                read_back(self, made)
            except BaseException as exc:  # noqa: BLE001 - see register()
                _stop(exc)
        return result

    governed._interlock = True  # type: ignore[attr-defined]
    setattr(cls, SEAM_METHOD, governed)
    cls.__post_init__ = checked


def final_config(config: Any, rel: Release, platform: str) -> dict[str, Any]:
    """What vLLM's finished config says it will run, in the decision's terms: the graph and
    compilation modes, the breakable verdict where ``rel`` keeps it, and the runner where it
    can be told (the only one on a release with one runner; ``use_v2_model_runner`` where the
    config has it)."""
    compilation = config.compilation_config
    seen: dict[str, Any] = {
        "cudagraph": compilation.cudagraph_mode.name.lower(),
        "compile": compilation.mode.name,
    }
    if rel.breakable_verdict == CONFIG_VERDICT:
        seen["breakable"] = bool(compilation.use_breakable_cudagraph)
    else:
        seen["breakable"] = os.environ.get(BREAKABLE_ENV) == "1"
    if len(rel.runners) == 1:
        seen["runner"] = rel.runners[0]
    elif isinstance(getattr(config, "use_v2_model_runner", None), bool):
        seen["runner"] = "mrv2" if config.use_v2_model_runner else "mrv1"
    return seen


def read_back(config: Any, made: PluginDecision) -> None:
    """Compare vLLM's final config with the decision the plugin applied; a field a later
    step of vLLM changed stops the engine, naming the field, both values and who decided."""
    platform = made.resolution.context.platform
    seen = final_config(config, made.release, platform)
    decision = made.decision
    expected = {
        "cudagraph": str(decision["cudagraph"]),
        "compile": compile_mode_name(bool(decision["compile"]), platform),
        "breakable": bool(decision["breakable"]),
        "runner": decision["runner"],
    }
    from interlock.app.decided_by import chooser

    problems = [
        f"{name}: decided {_shown(expected[name])} ({chooser(made.resolution.provenance[name])}"
        f"), but vLLM {made.release.version}'s final config has {_shown(value)}"
        for name, value in seen.items() if value != expected[name]
    ]
    if problems:
        raise PluginRefusal(
            "vLLM changed the decision after the plugin applied it (read back at the end of "
            "VllmConfig.__post_init__): " + "; ".join(problems))
    _logger.info("%s", "interlock: read back vLLM's final config: "
                       + ", ".join(f"{k}={_shown(v)}" for k, v in seen.items()))


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _govern(config: Any) -> None:
    model_config = config.model_config
    if model_config is None or getattr(model_config, "_interlock_governed", False):
        return
    if getattr(model_config, "config_updated", False):
        return  # vLLM has applied its hooks already: this view was governed before
    from interlock.policy.loader import load_policy

    # What governs this config is read from the environment here, once, before deciding.
    environ = {k: v for k, v in os.environ.items() if k not in _set_here}
    settings = Settings.read(environ)
    facts = engine_facts(config)
    policy = load_policy(None)
    made = plugin_decision(facts, policy, environ)
    apply(config, made)
    model_config._interlock_governed = True
    model_config._interlock_made = made
    APPLIED.append(made)
    _record(made, facts, settings)


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
    for warning in made.warnings:
        _logger.warning("%s", warning)
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
    if platform == "cpu" and hasattr(current_platform, "get_cpu_architecture"):
        # What decides 0.34.0's no-Triton rule on a CPU: x86 needs triton-cpu, others run a
        # standalone MRV2 (interlock/vllm/releases.py).
        features[CPU_ARCH] = cpu_arch_name(current_platform.get_cpu_architecture().name)
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


def _record(made: PluginDecision, facts: EngineFacts, settings: Settings) -> None:
    from interlock import decision_log

    path = decision_log.log_path(None, settings)
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
