"""The engine stage for vLLM: what one release (:mod:`interlock.vllm.releases`) makes of the
decision handed to it, applied inside the decision pipeline so that the resolution
``policy explain``, ``policy vllm`` and the plugin show is the one that release runs.

In order, each step in the trace with the release's ``file:line``:

1. the optimization level (``-O``, the ``optimization_level`` feature): its defaults fill
   the fields the policy left at its own defaults; a rule or env binding that decided
   otherwise is an error naming both (``policy vllm`` passes every field explicitly, so the
   level would be contradicted silently);
2. the release's adjustments to explicit settings (no static graphs on the platform, no
   piecewise graphs without compilation, a model given as pooling captured piecewise); an
   adjustment to a value the user forced is an error;
3. what the release cannot run: a runner it does not have (0.34.0 has no Model Runner V1), a
   field it reads no knob for set to another value than the one it has, Model Runner V2 (or,
   on 0.34.0, any runner on an x86 CPU) without a Triton for the platform. Each is a
   refusal in vLLM's own words, never a knob vLLM would reject.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlock.core.cudagraph import without_piecewise
from interlock.core.errors import PolicyError
from interlock.core.platform import TRITON_FACT
from interlock.policy.context import Context
from interlock.policy.model import Location, Policy
from interlock.policy.resolution import Draft, Refusal, Resolution
from interlock.policy.trace import DEFAULTS, ENGINE, IMPLIED, Provenance, Step
from interlock.vllm.releases import (
    ADJUSTMENTS,
    CPU_ARCH,
    KNOBS,
    LEVELS,
    Release,
    release,
)

#: The feature ``-O`` gives (interlock.vllm.flags reads it).
LEVEL_FEATURE = "optimization_level"


def level_source(level: int) -> str:
    """Who set a field the optimization level decided: the level, as ``vllm serve`` takes it
    (vLLM fills it itself, so no ``-cc`` flag carries it)."""
    return f"-O{level}"


def by_level(provenance: Provenance) -> bool:
    """Whether the optimization level decided this field (:func:`level_source`)."""
    return provenance.stage == ENGINE and provenance.source in {
        level_source(n) for n in LEVELS}


@dataclass(frozen=True)
class ReleaseStage:
    """The engine stage for vLLM ``version`` (a release interlock has read; None: the
    version is not known, so only what every release read does applies: the level and the
    adjustments, uncited, and nothing is refused). Hashable: the resolver memoizes by it."""

    version: str | None

    @property
    def release(self) -> Release | None:
        return None if self.version is None else release(self.version)

    @property
    def name(self) -> str:
        return "vLLM (version unknown)" if self.version is None else f"vLLM {self.version}"

    def __call__(self, draft: Draft) -> None:
        rel = self.release
        self._level(draft, rel)
        self._adjust(draft, rel)
        if rel is not None:
            self._refuse(draft, rel)

    # 1. the optimization level
    def _level(self, draft: Draft, rel: Release | None) -> None:
        level = draft.context.features.get(LEVEL_FEATURE)
        if level is None:
            return
        if level not in LEVELS:
            raise PolicyError(f"optimization_level={level!r}: vLLM's levels are 0, 1, 2 and 3")
        mode, compile_on = LEVELS[level]
        how = draft.context.source(f"features.{LEVEL_FEATURE}")
        for name, wanted in (("cudagraph", mode), ("compile", compile_on)):
            prov = draft.provenance[name]
            if draft.values[name] == wanted or prov.forced or prov.stage == IMPLIED:
                continue
            if prov.stage != DEFAULTS:
                where = f" at {prov.location}" if prov.location else ""
                raise PolicyError(
                    f"-O{level} sets {name}={_shown(wanted)} (vLLM's default at that level; "
                    f"{how}), but the policy decided {name}={_shown(draft.values[name])} "
                    f"({prov.stage} {prov.source}{where}) and policy vllm would pass "
                    f"-cc.{_flag(name)}={_cc(name, draft.values[name])} over it; say which you "
                    f"mean with -cc.{_flag(name)}=..."
                )
            self._assign(draft, rel, name, wanted, "levels",
                         f"vLLM's default at optimization level {level} ({how})",
                         source=level_source(level))

    # 2. the release's adjustments
    def _adjust(self, draft: Draft, rel: Release | None) -> None:
        values = draft.values
        if draft.context.platform == "cpu":
            if values["cudagraph"] != "none":
                self._adjusted(draft, rel, "cudagraph", "none", "static_graphs")
            return
        if not values["compile"] and not values["breakable"]:
            lowered = without_piecewise(values["cudagraph"])
            if lowered != values["cudagraph"]:
                self._adjusted(draft, rel, "cudagraph", lowered, "piecewise")
        # Given as the model's task (vLLM's --runner pooling), vLLM serves it as a pooling
        # model; which architectures vLLM's registry takes for pooling models by itself is
        # the policy's to say (a rule on the task trait), release by release.
        if draft.context.traits.get("task") == "pooling" and values["cudagraph"] != "piecewise":
            self._adjusted(draft, rel, "cudagraph", "piecewise", "pooling")

    def _adjusted(self, draft: Draft, rel: Release | None, name: str, value: Any,
                  why: str) -> None:
        prov = draft.provenance[name]
        if prov.forced:
            where = (rel.cites.get(why) if rel else None) or "vllm/config/vllm.py"
            # The command line's own words where it gave the value (policy vllm's flags).
            given = draft.context.sources.get(f"overrides.{name}") or (
                f"{prov.source} ({prov.stage})")
            raise PolicyError(
                f"{self.name} would run {name}={_shown(value)}, not the "
                f"{_shown(draft.values[name])} asked for with {given}: {ADJUSTMENTS[why]} "
                f"({where})"
            )
        self._assign(draft, rel, name, value, why, ADJUSTMENTS[why])

    def _assign(self, draft: Draft, rel: Release | None, name: str, value: Any, why: str,
                reason: str, source: str | None = None) -> None:
        where = rel.cites.get(why) if rel is not None else None
        before = {name: draft.values[name]}
        draft.assign(Provenance(name, value, ENGINE, source or self.name, reason, where))
        draft.record(Step(ENGINE, f"{self.name}: {why}", where, {name: value}, note=reason,
                          before=before))

    # 3. what the release cannot run
    def _refuse(self, draft: Draft, rel: Release) -> None:
        values, context = draft.values, draft.context
        runner = values["runner"]
        if runner not in rel.runners:
            if rel.gone is not None and runner == "mrv1":
                self._refusal(draft, rel.gone.message, rel.gone.where, "runner",
                              f"vLLM {rel.version} has {' and '.join(rel.runners)} only")
                return
            self._refusal(draft, f"vLLM {rel.version} has no runner {runner!r} (it has "
                          f"{' and '.join(rel.runners)})", None, "runner",
                          "the decision names a runner this vLLM does not have")
            return
        for name, only in rel.without.items():
            if values.get(name) != only:
                knob = next(k.name for k in KNOBS if k.field == name)
                self._refusal(draft, f"vLLM {rel.version} does not read {knob}, so it cannot "
                              f"run {name}={_shown(values.get(name))}", None, name,
                              f"{name} is {_shown(only)} in vLLM {rel.version}")
                return
        triton = _known_triton(draft)
        rule = rel.no_triton.get(context.platform)
        if triton is not None and not triton[0] and rule is not None:
            # Without the fact (not given, not read from vLLM) the CPU is taken for x86, the
            # platform vLLM's CPU builds are made for; the refusal's reason says so.
            arch = context.features.get(CPU_ARCH, "x86_64")
            if rule.runs is None and arch == "x86_64":
                how = (context.source(f"features.{CPU_ARCH}") if CPU_ARCH in context.features
                       else "assumed: give --feature cpu_arch=... for another CPU")
                self._refusal(draft, rule.message, rule.where, "runner",
                              f"no Triton for {context.platform} ({triton[1]}) on an x86 CPU "
                              f"({how})")
            elif rule.runs is not None and runner != rule.runs:
                self._refusal(draft, rule.message, rule.where, "runner",
                              f"runner={runner} is passed explicitly and there is no Triton "
                              f"for {context.platform} ({triton[1]})")

    def _refusal(self, draft: Draft, message: str, where: Location | None, name: str,
                 reason: str) -> None:
        draft.refusal = Refusal(self.name, where, message, reason, None,
                                {name: draft.provenance[name]})
        draft.record(Step(ENGINE, f"{self.name}: refuses", where, note=message, refuse=message))


def stage_for(engine: Mapping[str, str]) -> ReleaseStage | None:
    """The engine stage a question about vLLM ``engine["vllm"]`` is decided through, so that
    its answer is what that release runs: the release's where interlock has read it, else
    none. `policy explain`, `policy table` (a column's release or --engine-version) and
    `policy test` cases all take it from here."""
    from interlock.vllm.releases import known

    read = known(engine["vllm"]) if "vllm" in engine else None
    return ReleaseStage(read.version) if read is not None else None


def decide_with_release(
    policy: Policy, context: Context, overrides: Mapping[str, Any] | None = None, *,
    refused: bool = False,
) -> Resolution:
    """``context`` decided as `policy explain` decides the same question: by the one
    decision (:func:`~interlock.app.query.decide_context`), through :func:`stage_for` its
    vLLM version (a table row, a `policy test` case)."""
    from interlock.app.query import decide_context

    return decide_context(policy, context, overrides, stage=stage_for(context.engine),
                          refused=refused)


def _known_triton(draft: Draft) -> tuple[bool, str] | None:
    """The context's ``has_triton`` where it speaks of the engine: given, or read from the
    engine's environment (not an assumption, nor interlock's own environment)."""
    context = draft.context
    if TRITON_FACT not in context.features:
        return None
    source = context.source(f"features.{TRITON_FACT}")
    if source.startswith("given") or "engine" in source:
        return bool(context.features[TRITON_FACT]), source
    return None


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _cc(name: str, value: Any) -> str:
    """A field's value as its ``-cc`` flag writes it."""
    if name == "cudagraph":
        return str(value).upper()
    return "VLLM_COMPILE" if value else "NONE"


def _flag(name: str) -> str:
    return "cudagraph_mode" if name == "cudagraph" else "mode"
