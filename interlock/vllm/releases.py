"""Every vLLM release interlock has read, as one table: :data:`RELEASES`.

A :class:`Release` says what one release does with a decision handed to it, each fact read
in that release's wheel and cited ``file:line``:

- ``knobs``: the environment variables and ``vllm serve`` flags it reads for a decision
  field, and what a field is where it reads no knob (``without``);
- ``runners``: the model runners it has (0.34.0 removed Model Runner V1), and what it says
  when asked for another (``gone``);
- ``breakable_verdict``: where its final breakable-graph verdict is held after
  ``VllmConfig.__post_init__`` (``os.environ`` until 0.33, the compilation config from 0.34);
- ``seam``: where it applies its per-architecture config hooks, the method the plugin
  wraps (None: not read for this release, so the plugin does not govern it);
- ``no_triton``: what it does on each platform without a Triton for it;
- ``logs``: where it logs the startup lines ``policy vllm serve`` checks.

The decision pipeline applies a release through :mod:`interlock.vllm.stage`; ``policy vllm``,
the plugin and the startup-log check read it here. A version is *known* when its release
number is in the table (``0.33.0rc1``, ``0.33.0.post1`` and ``0.33.0+cu130`` are 0.33.0); any
other release is refused rather than guessed (``make vllm-release VLLM=X`` takes one in).
Torch-free; ``packaging`` is imported only to parse a version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.core.errors import PolicyError
from interlock.policy.model import Location

#: The runners vLLM has ever had, as interlock names them.
MRV1, MRV2 = "mrv1", "mrv2"
#: Optimization level -> (cudagraph mode, compile) it defaults to (OPTIMIZATION_LEVEL_TO_CONFIG
#: of every release read; where each release has it: ``Release.cites["levels"]``).
LEVELS = {0: ("none", False), 1: ("piecewise", True), 2: ("full_and_piecewise", True),
          3: ("full_and_piecewise", True)}


@dataclass(frozen=True)
class Knob:
    """An environment variable or ``vllm serve`` flag that carries one decision field."""

    name: str
    kind: str  # "env" or "flag"
    field: str
    #: An env knob's text for each value of its field, as vLLM reads it (empty for a flag,
    #: whose text is the value itself).
    values: tuple[tuple[Any, str], ...] = ()

    def text(self, value: Any) -> str:
        """The knob's text for a decided ``value`` (KeyError for one vLLM cannot take)."""
        return dict(self.values)[value]


RUNNER_KNOB = Knob("VLLM_USE_V2_MODEL_RUNNER", "env", "runner", ((MRV1, "0"), (MRV2, "1")))
BREAKABLE_KNOB = Knob("VLLM_USE_BREAKABLE_CUDAGRAPH", "env", "breakable",
                      ((False, "0"), (True, "1")))
CUDAGRAPH_KNOB = Knob("-cc.cudagraph_mode", "flag", "cudagraph")
COMPILE_KNOB = Knob("-cc.mode", "flag", "compile")
#: Every knob any release reads, in the order a command line carries them.
KNOBS = (RUNNER_KNOB, BREAKABLE_KNOB, CUDAGRAPH_KNOB, COMPILE_KNOB)


@dataclass(frozen=True)
class Gone:
    """What a release says, and where, when a runner it no longer has is asked for."""

    message: str
    where: Location


@dataclass(frozen=True)
class LogFormats:
    """Where a release logs each startup line the engine check reads (the messages are
    :mod:`interlock.vllm.startup_log`'s); ``runner_v2`` is None where no line says the runner."""

    config: Location
    runner_v2: Location | None
    breakable: Location
    auto_breakable: Location
    ready: Location


#: The feature naming a CPU's architecture (``x86_64``, ``arm``, ``powerpc``...): given with
#: ``--feature cpu_arch=...``, or by vLLM's own platform inside it (the plugin).
CPU_ARCH = "cpu_arch"


def cpu_arch_name(vllm_name: str) -> str:
    """vLLM's ``CpuArchEnum`` name as the ``cpu_arch`` feature says it (``X86`` is
    ``x86_64``, the others lower-cased)."""
    return "x86_64" if vllm_name == "X86" else vllm_name.lower()


@dataclass(frozen=True)
class NoTriton:
    """What a release does on a platform without a Triton for it: the runner it runs there
    by default (None: it does not start), and its message where it refuses."""

    runs: str | None
    message: str
    where: Location


@dataclass(frozen=True)
class Release:
    """One vLLM release, as read in its wheel."""

    version: str
    knobs: tuple[Knob, ...]
    #: A field no knob of this release carries -> the only value it has there.
    without: Mapping[str, Any]
    runners: tuple[str, ...]
    gone: Gone | None
    breakable_verdict: str
    seam: Location | None
    #: ``seam``'s call inside ``VllmConfig.__post_init__``.
    seam_call: Location | None
    no_triton: Mapping[str, NoTriton] = field(default_factory=dict)
    logs: LogFormats | None = None
    #: Where it makes each adjustment the engine stage applies (:data:`ADJUSTMENTS`).
    cites: Mapping[str, Location] = field(default_factory=dict)

    def knob_for(self, field_name: str) -> Knob | None:
        return next((k for k in self.knobs if k.field == field_name), None)

    def reads(self, knob: Knob) -> bool:
        return knob in self.knobs

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "knobs": [k.name for k in self.knobs],
            "runners": list(self.runners),
            "breakable_verdict": self.breakable_verdict,
            "seam": str(self.seam) if self.seam else None,
            "logs": None if self.logs is None else {
                k: (str(v) if v else None) for k, v in vars(self.logs).items()},
        }


def _at(file: str, line: int) -> Location:
    """A place in a release's wheel, as the trace cites it (``vllm/config/vllm.py:3457``)."""
    return Location(file, line)


_CFG = "vllm/config/vllm.py"
_COMP = "vllm/config/compilation.py"
_WORKER = "v1/worker/gpu_worker.py"
_CORE = "v1/engine/core.py"
_BREAK = "compilation/breakable_cudagraph.py"
_ENTRY = "entrypoints/launchers/api_server/entry.py"
_OPENAI = "entrypoints/openai/api_server.py"
ENV_VERDICT = "os.environ VLLM_USE_BREAKABLE_CUDAGRAPH (written by VllmConfig.__post_init__)"
CONFIG_VERDICT = "compilation_config.use_breakable_cudagraph (vllm/config/compilation.py:735)"
_ALL = (RUNNER_KNOB, BREAKABLE_KNOB, CUDAGRAPH_KNOB, COMPILE_KNOB)
_NO_BREAKABLE = (RUNNER_KNOB, CUDAGRAPH_KNOB, COMPILE_KNOB)
_V1_V2 = (MRV1, MRV2)


#: The adjustments a release makes to explicit settings, by the name :attr:`Release.cites`
#: cites them under.
ADJUSTMENTS = {
    "levels": "the optimization level's defaults (OPTIMIZATION_LEVEL_TO_CONFIG) fill what "
              "nothing set",
    "static_graphs": "a platform without static graphs (support_static_graph_mode() false) "
                     "runs cudagraph_mode NONE",
    "piecewise": "without torch.compile and without breakable graphs there are no piecewise "
                 "graphs",
    "pooling": "pooling models are captured with piecewise graphs",
}


def _cites(levels: int, static: int, piecewise: Location, pooling: int) -> Mapping[str, Location]:
    return {"levels": _at(_CFG, levels), "static_graphs": _at(_CFG, static),
            "piecewise": piecewise, "pooling": _at(_CFG, pooling)}


def _v1_fallback(line: int) -> Mapping[str, NoTriton]:
    """0.30-0.33: without Triton V1 runs by default and a forced V2 stops the engine."""
    why = NoTriton(MRV1, "Model Runner V2 requires Triton.", _at(_CFG, line))
    return {"cuda": why, "rocm": why, "xpu": why, "cpu": why}


def _logs(config: int, v2: int, breakable: int, auto: int, ready: Location) -> LogFormats:
    return LogFormats(_at(_CORE, config), _at(_WORKER, v2), _at(_BREAK, breakable),
                      _at(_CFG.removeprefix("vllm/"), auto), ready)


def _old(version: str, knobs: tuple[Knob, ...]) -> Release:
    """A release whose knobs were read, and nothing else: no seam, no log formats."""
    without = {} if BREAKABLE_KNOB in knobs else {"breakable": False}
    return Release(version, knobs, without, _V1_V2, None, ENV_VERDICT, None, None)


#: The releases read, oldest first. Evidence: each release's vllm/envs.py,
#: vllm/config/compilation.py and vllm/config/vllm.py; the log lines' files as named.
RELEASES: tuple[Release, ...] = (
    _old("0.16.0", _NO_BREAKABLE),
    _old("0.19.0", _NO_BREAKABLE),
    _old("0.20.2", _NO_BREAKABLE),
    _old("0.21.0", _NO_BREAKABLE),
    _old("0.22.0", _ALL),
    _old("0.26.0", _ALL),
    Release("0.27.1", _ALL, {}, _V1_V2, None, ENV_VERDICT, _at(_CFG, 2055), _at(_CFG, 981),
            logs=_logs(122, 385, 288, 1232, _at(_OPENAI, 682)),
            cites=_cites(229, 1371, _at(_COMP, 1133), 1380)),
    Release("0.28.0", _ALL, {}, _V1_V2, None, ENV_VERDICT, _at(_CFG, 2163), _at(_CFG, 1061),
            logs=_logs(123, 396, 288, 1335, _at(_OPENAI, 657)),
            cites=_cites(221, 1478, _at(_COMP, 1134), 1487)),
    Release("0.29.0", _ALL, {}, _V1_V2, None, ENV_VERDICT, _at(_CFG, 2319), _at(_CFG, 1086),
            logs=_logs(123, 429, 288, 717, _at(_ENTRY, 139)),
            cites=_cites(239, 1530, _at(_COMP, 1140), 1539)),
    Release("0.30.0", _ALL, {}, _V1_V2, None, ENV_VERDICT, _at(_CFG, 2530), _at(_CFG, 1265),
            _v1_fallback(1265), _logs(124, 441, 293, 763, _at(_ENTRY, 139)),
            cites=_cites(256, 1725, _at(_CFG, 1010), 1734)),
    Release("0.31.0", _ALL, {}, _V1_V2, None, ENV_VERDICT, _at(_CFG, 2766), _at(_CFG, 1434),
            _v1_fallback(1434), _logs(130, 479, 294, 844, _at(_ENTRY, 136)),
            cites=_cites(254, 1913, _at(_CFG, 1102), 1922)),
    Release("0.32.0", _ALL, {}, _V1_V2, None, ENV_VERDICT, _at(_CFG, 2629), _at(_CFG, 1443),
            _v1_fallback(1443), _logs(134, 518, 294, 819, _at(_ENTRY, 140)),
            cites=_cites(247, 1874, _at(_CFG, 1077), 1883)),
    Release("0.33.0", _ALL, {}, _V1_V2, None, ENV_VERDICT, _at(_CFG, 2735), _at(_CFG, 1539),
            _v1_fallback(1539), _logs(140, 513, 294, 849, _at(_ENTRY, 139)),
            cites=_cites(255, 1950, _at(_CFG, 1129), 1959)),
    # 0.34.0 removed Model Runner V1: VLLM_USE_V2_MODEL_RUNNER left envs.py, and
    # Platform.validate_environ (called from EngineArgs.create_engine_config before any
    # VllmConfig exists) refuses =0 and only warns on =1. The breakable verdict moved into
    # the compilation config. x86 CPUs need triton-cpu; other CPUs run a standalone MRV2.
    Release(
        "0.34.0", (BREAKABLE_KNOB, CUDAGRAPH_KNOB, COMPILE_KNOB), {"runner": MRV2}, (MRV2,),
        Gone("VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported: Model Runner V1 has been "
             "removed. Unset this variable.", _at("vllm/platforms/interface.py", 1483)),
        CONFIG_VERDICT, _at(_CFG, 2816), _at(_CFG, 1483),
        {"cpu": NoTriton(None, "vLLM on x86 CPUs requires Triton (triton-cpu).",
                         _at("vllm/platforms/cpu.py", 243))},
        LogFormats(_at(_CORE, 153), None, _at(_BREAK, 302), _at("config/vllm.py", 816),
                   _at(_ENTRY, 139)),
        _cites(283, 1862, _at(_CFG, 1050), 1871),
    ),
)

BY_VERSION: Mapping[str, Release] = {r.version: r for r in RELEASES}
NEWEST = RELEASES[-1]


def release_number(version: str) -> str:
    """``0.33.0`` for ``0.33.0``, ``0.33.0rc1``, ``0.33.0.post1`` and ``0.33.0+cu130`` (a
    version that is not one is a :class:`PolicyError`)."""
    from packaging.version import InvalidVersion, Version

    try:
        numbers = Version(version).release
    except InvalidVersion:
        raise PolicyError(f"vLLM version {version!r} is not a version (e.g. 0.34.0)") from None
    return ".".join(str(n) for n in (*numbers, 0, 0)[: max(3, len(numbers))])


def known(version: str) -> Release | None:
    """The release ``version`` is, when interlock has read it."""
    return BY_VERSION.get(release_number(version))


class UnknownRelease(PolicyError):
    """A vLLM release interlock has not read: what it does with a decision is not known, so
    interlock does not decide for it (exit 5, ``refused``)."""

    kind = "refused"


def release(version: str, otherwise: str = "use a vLLM interlock knows") -> Release:
    """The release ``version`` is; :class:`UnknownRelease` when it was not read, its message
    ending with what to do ``otherwise``."""
    found = known(version)
    if found is None:
        raise UnknownRelease(
            f"vLLM {version} is a release interlock has not read (it knows "
            f"{', '.join(BY_VERSION)}): which knobs it reads, what it refuses and what it "
            f"logs are not established. Take it in with `make vllm-release "
            f"VLLM={release_number(version)}`, or {otherwise}"
        )
    return found


def use_instead(version: str) -> str:
    """What to use for vLLM ``version`` instead of a policy written for another release: the
    policy of every release read (``--policy @all-releases``) where it covers it."""
    from interlock.policy.loader import ALL_RELEASES_ALIAS, load_policy
    from interlock.policy.release import releases

    covering = [r for r in releases(load_policy([ALL_RELEASES_ALIAS])) if r.covers(version)]
    if covering:
        return (f"use --policy {ALL_RELEASES_ALIAS} (vLLM {covering[0].text}, one rule set for "
                f"every release read; layer a site policy on it as "
                f"{ALL_RELEASES_ALIAS}:site.yaml) or a policy written for vLLM {version}")
    return f"use a policy written for vLLM {version}"


def binding_problems(bindings: Mapping[str, Any]) -> list[str]:
    """Where a policy's env bindings (``policy.env``) read one of vLLM's env knobs otherwise
    than vLLM does (another field, or a text mapped to another value): the policy would
    decide from the variable what the engine does not do with it."""
    problems = []
    for k in KNOBS:
        binding = bindings.get(k.name)
        if k.kind != "env" or binding is None:
            continue
        where = f"{binding.location}: env binding {k.name}"
        if binding.field != k.field:
            problems.append(f"{where} sets {binding.field}; vLLM reads it as {k.field}")
            continue
        meaning = {text: value for value, text in k.values}
        for text, value in binding.values.items():
            if text in meaning and meaning[text] != value:
                problems.append(f'{where} maps "{text}" to {value}; vLLM reads "{text}" as '
                                f"{k.field}={meaning[text]}")
    return problems
