"""The checks a runner plugin runs against itself: the runner contract, its declarations
and a tiny model (see ``interlock.testing``).

Each check returns findings (empty when the plugin conforms), so the same
checks serve pytest, a CI script or an interactive session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from interlock.plugins.discovery import PluginSource, Settings, discover, summarize
from interlock.plugins.registry import PluginRecord, PluginRegistry
from interlock.plugins.spec import RunnerSpec, load_import_path

if TYPE_CHECKING:
    from pathlib import Path

    from interlock.core.decision import Decision
    from interlock.runners.contract import Runner


@dataclass(frozen=True)
class Finding:
    check: str
    subject: str  # the runner or kernel concerned, or the plugin
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.subject}: {self.message}"


def load_under_test(plugin: object, name: str) -> PluginRecord:
    """Load ``plugin`` alone, exactly as discovery loads an installed one."""
    source = PluginSource(name, "under-test", "0", f"under test {name}", lambda: plugin)
    return discover([source], Settings()).registry.plugins[0]


def check_loads(record: PluginRecord, installed: PluginRegistry) -> list[Finding]:
    """The plugin loads, is API-compatible, declares something, and clashes with nobody."""
    if record.status != "ok":
        return [Finding("loads", record.name, record.status_line)]
    found = []
    if not record.runners and not record.kernels:
        found.append(Finding("loads", record.name, "declares no runner and no kernel"))
    names = [spec.name for spec in record.runners]
    for name in sorted({n for n in names if names.count(n) > 1}):
        found.append(Finding("loads", name, "declared twice by this plugin"))
    for spec in record.runners:
        other = installed.find(spec.name)
        if other is not None and other.spec != spec:
            found.append(Finding("loads", spec.name, f"also registered by {other.plugin.provider}"))
    return found


def check_capabilities(record: PluginRecord, installed: PluginRegistry) -> list[Finding]:
    """Declarations agree with each other: fallbacks exist and end, conditions are not vacuous."""
    known = {reg.spec.name: reg.spec for reg in installed.runners()}
    known.update({spec.name: spec for spec in record.runners})
    found = []
    for spec in record.runners:
        chain = [spec.name]
        current = spec
        while current.fallback is not None:
            if current.fallback in chain:
                found.append(
                    Finding(
                        "capabilities",
                        spec.name,
                        "fallback chain loops: " + " -> ".join([*chain, current.fallback]),
                    )
                )
                break
            chain.append(current.fallback)
            if current.fallback not in known:
                found.append(
                    Finding(
                        "capabilities",
                        spec.name,
                        f"falls back to {current.fallback!r}, which is not registered",
                    )
                )
                break
            current = known[current.fallback]
        for i, item in enumerate(spec.unsupported):
            platforms = item.when.get("platform")
            if set(item.when) == {"platform"}:
                found.append(
                    Finding(
                        "capabilities",
                        spec.name,
                        f"unsupported[{i}] ({item.feature}) excludes whole platforms "
                        f"{platforms!r}: leave them out of `platforms` instead",
                    )
                )
    return found


def check_factories(record: PluginRecord) -> list[Finding]:
    """Every runner's factory imports and is callable (a class, or a function building one)."""
    found = []
    for spec in record.runners:
        try:
            factory = load_import_path(spec.factory)
        except Exception as exc:
            found.append(
                Finding("factory", spec.name, f"{spec.factory} is not importable: {summarize(exc)}")
            )
            continue
        if not callable(factory):
            found.append(
                Finding(
                    "factory",
                    spec.name,
                    f"{spec.factory} is a {type(factory).__name__}, not callable",
                )
            )
    return found


def check_inherited_claims(record: PluginRecord) -> list[Finding]:
    """A runner whose class subclasses another runner's (a built-in's: docs/plugins.md,
    "Building on a built-in runner") claims no more than the base's spec serves: the
    subclass runs the base's code, and its ``load()`` judges decisions by the subclass's
    spec, so stage 5 would hand it what that code cannot serve. A factory that does not
    import is :func:`check_factories`' finding."""
    found = []
    for spec in record.runners:
        try:
            factory = load_import_path(spec.factory)
        except Exception:
            continue
        base = _inherited_spec(factory)
        if base is None or base.name == spec.name:
            continue
        claims = spec.claims_beyond(base)
        if claims:
            found.append(Finding(
                "claims", spec.name,
                f"{spec.factory} runs {base.name}'s code but its spec claims more than "
                f"{base.name} serves: {'; '.join(claims)}; declare no more than its spec "
                f"does (its platforms= and unsupported=, as examples/wrapped-runner-plugin "
                "does)",
            ))
    return found


def _inherited_spec(factory: object) -> RunnerSpec | None:
    """The ``runner_spec`` of the nearest base class of ``factory`` (a class) that sets one."""
    if not isinstance(factory, type):
        return None
    for cls in factory.__mro__[1:]:
        spec = cls.__dict__.get("runner_spec")
        if isinstance(spec, RunnerSpec):
            return spec
    return None


def check_kernels(record: PluginRecord) -> list[Finding]:
    """Kernel specs name known ops and importable functions (imports kernels, hence torch)."""
    from interlock.kernels import REGISTRY

    found = []
    for spec in record.kernels:
        subject = f"{spec.op}/{spec.backend}"
        if spec.op not in REGISTRY.ops():
            found.append(
                Finding(
                    "kernels", subject, f"unknown op {spec.op!r}; ops: {', '.join(REGISTRY.ops())}"
                )
            )
        for path in filter(None, (spec.target, spec.unavailable)):
            try:
                obj = load_import_path(path)
            except Exception as exc:
                found.append(
                    Finding("kernels", subject, f"{path} is not importable: {summarize(exc)}")
                )
                continue
            if not callable(obj):
                found.append(Finding("kernels", subject, f"{path} is not callable"))
    return found


#: A Llama small enough to run anywhere in a blink, with dummy (seeded random) weights.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.1,  # peaked logits: no near-ties for kernel differences to flip
    "rms_norm_eps": 1e-6,
}
TINY_PROMPTS = ([1, 2, 3, 4, 5], [7, 8], [11, 12, 13, 14, 15, 16, 17, 18, 19])
TINY_MAX_TOKENS = 5


def check_runs_tiny_model(record: PluginRecord) -> list[Finding]:
    """Each runner generates on a tiny model on this machine, in every graph mode (and with
    breakable capture, if declared) it serves here: greedy tokens must equal those of the
    reference, interlock's mrv1 running eagerly. A runner that does not serve this
    machine's platform, or needs a fact that does not hold here, is not run."""
    import json
    import tempfile
    from pathlib import Path

    from interlock.core.platform import detect_platform
    from interlock.runners.contract import Decision
    from interlock.runners.machine import machine_facts
    from interlock.runners.mrv1.runner import MRV1Runner

    platform = detect_platform()[0]
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp)
        (model / "config.json").write_text(json.dumps(TINY_LLAMA))
        expected = _generate(model, platform, MRV1Runner(), Decision())
        for spec in record.runners:
            support = spec.platforms.get(platform)
            if support is None:
                continue
            modes = list(support.cudagraph)  # stored in the vocabulary's order
            candidates = [Decision(spec.name, mode) for mode in modes]
            if support.breakable:
                candidates.append(Decision(spec.name, modes[-1], breakable=True))
            # What the runner serves here, as stage 5 and its own load judge it (a fact it
            # requires that does not hold on this machine rules a decision out).
            facts = machine_facts(support.requires, platform)
            decisions = [d for d in candidates if not spec.unserved(d, platform, facts=facts)]
            for decision in decisions:
                what = f"cudagraph={decision.cudagraph}" + (
                    " breakable" if decision.breakable else ""
                )
                try:
                    tokens = _generate(
                        model, platform, load_import_path(spec.factory)(), decision
                    )
                except Exception as exc:
                    found.append(Finding("runs", spec.name, f"{what}: {summarize(exc)}"))
                    continue
                if tokens != expected:
                    found.append(
                        Finding(
                            "runs", spec.name,
                            f"{what}: greedy tokens {tokens} differ from the reference "
                            f"(mrv1, eager) {expected}",
                        )
                    )
    return found


def _generate(
    model: Path, platform: str, runner: Runner, decision: Decision
) -> list[list[int]]:
    from interlock.core.platform import device_for
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams

    llm = LLM(
        model, load_format="dummy", dtype="float32",
        device=device_for(platform),
        max_num_seqs=len(TINY_PROMPTS), max_num_batched_tokens=8, max_model_len=64,
        runner=runner, decision=decision,
    )
    outputs = llm.generate(list(TINY_PROMPTS), SamplingParams(temperature=0,
        max_tokens=TINY_MAX_TOKENS))
    return [list(o.token_ids) for o in outputs]


#: Checks that execute the runner. Each takes the record and returns findings.
MODEL_CHECKS: list[Callable[[PluginRecord], list[Finding]]] = [check_runs_tiny_model]
