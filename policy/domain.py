"""The finite domain of contexts over which policies are linted and compared.

A policy can only tell contexts apart through the names and values its rules
mention, so a finite set of representatives covers every distinct behaviour:

- architectures: the catalog's, plus those rules name literally (uncatalogued
  names are real inputs too, with unknown traits);
- platforms: the four built-in ones plus any a rule names;
- device archs: per platform, those the rules mention (a glob by one name it
  matches) plus one unnamed arch (``""``: matched by no named pattern);
  a device arch is paired only with the platforms its rule can match;
- features: for each feature a condition mentions, "not given" and values on
  each side of every threshold and at every compared value (all combinations);
- env states: nothing set, then each declared value of each binding, one
  binding at a time;
- config states: "no model config", then one config per distinct truth
  assignment of the config predicates the rules mention (their paths absent,
  or at values on each side of every threshold), the way architectures stand
  for the catalog;
- model identities: none, then one name per distinct truth assignment of the
  rules' ``model:`` globs;
- engine versions: none, then one version per distinct truth assignment of the
  rules' ``engine:`` specifier sets (each bound, just below and just above it).

Two policies are compared over the union of their domains.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from interlock.core.platform import PLATFORM_NAMES
from interlock.policy.conditions import (
    Condition,
    ConfigMatch,
    EngineMatch,
    FeatureMatch,
    ModelMatch,
    NameMatch,
    When,
    is_glob,
    wanted_text,
)
from interlock.policy.context import Context
from interlock.policy.model import Policy

#: The device arch standing for "any arch no rule names".
UNNAMED_DEVICE_ARCH = ""
#: A string no compared value equals, for `ne`/`in` conditions on string features.
OTHER_STRING = "(other)"

EnvState = tuple[tuple[str, str], ...]
FeatureState = tuple[tuple[str, Any], ...]
#: A model config as dotted path -> value; None: no model config.
ConfigState = tuple[tuple[str, Any], ...] | None
#: The model's identity (names); ``()``: none.
ModelState = tuple[str, ...]
#: Engine -> version; ``()``: no engine version.
EngineState = tuple[tuple[str, str], ...]
#: What a context has besides its architecture, place and env.
Extra = tuple[FeatureState, ConfigState, ModelState, EngineState]


@dataclass(frozen=True)
class Domain:
    architectures: tuple[str, ...]
    #: Platform -> its device archs, the unnamed one last.
    device_archs: dict[str, tuple[str, ...]]
    #: ``()`` (nothing set) first, then one ``((name, value),)`` per declared value.
    env_states: tuple[EnvState, ...]
    #: ``()`` (no feature given) first, then every combination of feature values.
    feature_states: tuple[FeatureState, ...]
    #: None (no model config) first, then one config per truth assignment of the predicates.
    config_states: tuple[ConfigState, ...] = (None,)
    model_states: tuple[ModelState, ...] = ((),)
    engine_states: tuple[EngineState, ...] = ((),)
    #: The config predicates the states were enumerated over, as written (``config.x > 70``).
    config_predicates: tuple[str, ...] = ()

    @classmethod
    def of(cls, *policies: Policy) -> Domain:
        """The domain of one policy, or the union of several policies' domains."""
        archs: dict[str, None] = {}
        # Every domain holds the platforms interlock knows, and those rules name.
        platforms: dict[str, None] = dict.fromkeys(PLATFORM_NAMES)
        for policy in policies:
            archs.update(dict.fromkeys(policy.catalog))
            for rule in policy.rules:
                arch = rule.when.name_match("architecture")
                if arch is not None:
                    archs.update(dict.fromkeys(sorted(arch.literals)))
                platform = rule.when.name_match("platform")
                if platform is not None:
                    platforms.update(dict.fromkeys(sorted(platform.literals)))
        named: dict[str, dict[str, None]] = {p: {} for p in platforms}
        for policy in policies:
            for rule in policy.rules:
                device = rule.when.name_match("device_arch")
                if device is None:
                    continue
                for p in _platforms_of(rule.when.name_match("platform"), platforms):
                    named[p].update(dict.fromkeys(_representatives(device)))
        device_archs = {
            p: (*sorted(n for n in named[p] if n != UNNAMED_DEVICE_ARCH), UNNAMED_DEVICE_ARCH)
            for p in platforms
        }
        conditions = [c for policy in policies for rule in policy.rules for c in _all(rule.when)]
        configs = [c for c in conditions if isinstance(c, ConfigMatch)]
        return cls(
            architectures=tuple(archs),
            device_archs=device_archs,
            env_states=_env_states(policies),
            feature_states=_feature_states(policies),
            config_states=config_states(configs),
            model_states=_model_states([c for c in conditions if isinstance(c, ModelMatch)]),
            engine_states=_engine_states([c for c in conditions if isinstance(c, EngineMatch)]),
            config_predicates=tuple(dict.fromkeys(predicate_text(c) for c in configs)),
        )

    @property
    def platforms(self) -> tuple[str, ...]:
        return tuple(self.device_archs)

    def platforms_of(self, when: When) -> tuple[str, ...]:
        """The platforms of the domain that ``when``'s platform condition can match."""
        return tuple(_platforms_of(when.name_match("platform"), self.platforms))

    def places(self) -> Iterator[tuple[str, str]]:
        """Every (platform, device arch) pair."""
        for platform, archs in self.device_archs.items():
            for device_arch in archs:
                yield platform, device_arch

    def extras(self) -> list[Extra]:
        """Every combination of feature, config, model and engine states."""
        return list(
            itertools.product(
                self.feature_states, self.config_states, self.model_states, self.engine_states
            )
        )

    def contexts(self, *, with_env: bool = True) -> Iterator[Context]:
        """Every context of the domain; ``with_env=False`` leaves the environment empty
        (enough to see which rules match: env bindings act after the rules)."""
        envs = self.env_states if with_env else ((),)
        places = list(self.places())
        extras = self.extras()
        for arch in self.architectures:
            for platform, device_arch in places:
                for features, config, model, engine in extras:
                    for env in envs:
                        yield Context(
                            architecture=arch,
                            platform=platform,
                            device_arch=device_arch,
                            features=dict(features),
                            env=dict(env),
                            config=None if config is None else dict(config),
                            identity=tuple((name, DOMAIN_IDENTITY) for name in model),
                            engine=dict(engine),
                        )

    def size(self, *, with_env: bool = True) -> int:
        envs = len(self.env_states) if with_env else 1
        places = sum(len(archs) for archs in self.device_archs.values())
        return len(self.architectures) * places * len(self.extras()) * envs

    def describe_enumeration(self) -> list[str]:
        """What the domain enumerates beyond the catalog, in words, for reports."""
        lines = []
        if self.config_predicates:
            lines.append(
                f"config: {len(self.config_states) - 1} distinct truth assignments of the "
                f"config predicates the policies mention ({', '.join(self.config_predicates)}), "
                "and no model config (the predicates unknown)"
            )
        if len(self.model_states) > 1:
            names = ", ".join(s[0] for s in self.model_states[1:])
            lines.append(f"model: no identity, and one name per truth assignment of the "
                         f"model globs ({names})")
        if len(self.engine_states) > 1:
            versions = ", ".join(
                " ".join(f"{e} {v}" for e, v in s) for s in self.engine_states[1:]
            )
            lines.append(f"engine: no version, and one per truth assignment of the engine "
                         f"conditions ({versions})")
        return lines


#: Where the identity of a domain context comes from.
DOMAIN_IDENTITY = "domain"


def _all(when: When) -> tuple[Condition, ...]:
    return when.conditions


def predicate_text(condition: ConfigMatch) -> str:
    """``num_hidden_layers > 70``: a config predicate as reports show it."""
    return f"{condition.key} {wanted_text(condition.to_data())}"


def config_states(conditions: list[ConfigMatch]) -> tuple[ConfigState, ...]:
    """No model config, then one config per distinct truth assignment of ``conditions`` (the
    all-false one included: a config that fails every predicate is not "no config"): each
    path at each witness value of its conditions, or absent; the product over paths is
    reduced to one representative per assignment (the first)."""
    if not conditions:
        return (None,)
    witnesses: dict[str, list[Any]] = {}
    for condition in conditions:
        known = witnesses.setdefault(condition.key, [])
        for value in _feature_values(FeatureMatch(condition.key, condition.ops)):
            if not any(_same(value, k) for k in known):
                known.append(value)
    paths = list(witnesses)
    seen: set[tuple[bool, ...]] = set()
    states: list[ConfigState] = [None]
    # A path absent (None) comes last: a present value shows a branch more plainly.
    for combo in itertools.product(*([*witnesses[p], None] for p in paths)):
        present = {p: v for p, v in zip(paths, combo, strict=True) if v is not None}
        truth = tuple(
            c.key in present and c.value_holds(present[c.key]) for c in conditions
        )
        if truth in seen:
            continue
        seen.add(truth)
        states.append(tuple(present.items()))
    return tuple(states)


def _model_states(conditions: list[ModelMatch]) -> tuple[ModelState, ...]:
    """No identity, then one name per distinct truth assignment of the globs (a witness of
    each pattern, and a name none matches)."""
    if not conditions:
        return ((),)
    names = ["(other)"]
    for condition in conditions:
        for pattern in condition.patterns:
            names += [w for w in _glob_witnesses(pattern) if condition.matches(w)][:1]
    seen: set[tuple[bool, ...]] = set()
    states: list[ModelState] = [()]
    for name in dict.fromkeys(names):
        truth = tuple(c.matches(name) for c in conditions)
        if truth not in seen:
            seen.add(truth)
            states.append((name,))
    return tuple(states)


def _engine_states(conditions: list[EngineMatch]) -> tuple[EngineState, ...]:
    """No version, then per engine one version per distinct truth assignment of its
    specifier sets: every bound they name, just below and just above it."""
    if not conditions:
        return ((),)
    per_engine: dict[str, list[EngineMatch]] = {}
    for condition in conditions:
        per_engine.setdefault(condition.engine, []).append(condition)
    choices: list[list[tuple[str, str] | None]] = []
    for engine, matches in per_engine.items():
        bounds = sorted({b for m in matches for spec in m.spec for b in _bounds(spec)})
        # The bounds themselves first: a state is shown by the first version with its truth.
        candidates = [str(b) for b in bounds]
        candidates += [v for b in bounds for v in (_previous(b), _below(b), _above(b)) if v]
        seen: set[tuple[bool, ...]] = set()
        versions: list[tuple[str, str] | None] = [None]
        for version in dict.fromkeys(candidates):
            truth = tuple(m.version_holds(version) for m in matches)
            if truth not in seen:
                seen.add(truth)
                versions.append((engine, version))
        # Shown in version order (the first version with each truth was kept above).
        known = sorted((pair for pair in versions if pair), key=lambda pair: Version(pair[1]))
        versions = [None, *known]
        choices.append(versions)
    return tuple(
        tuple(pair for pair in combo if pair is not None) for combo in itertools.product(*choices)
    )


def _bounds(spec: Any) -> list[Version]:
    """The versions where a specifier's truth can change: its version, and for ``~=`` and
    wildcards (``==0.32.*``) the release after the line it names."""
    text = spec.version
    if spec.operator == "===":
        return []
    wildcard = text.endswith(".*")
    version = Version(text[:-2] if wildcard else text)
    out = [version]
    release = list(version.release)
    if spec.operator == "~=" and len(release) > 1:
        release = release[:-1]
    elif not wildcard:
        return out
    release[-1] += 1
    out.append(Version(".".join(map(str, release))))
    return out


def _previous(version: Version) -> str | None:
    """The release line before ``version`` (``0.32`` -> ``0.31``), None below ``0``: a
    plainer witness than :func:`_below` where no other bound lies between them."""
    release = list(version.release)
    while release and release[-1] == 0:
        release.pop()
    if not release:
        return None
    release[-1] -= 1
    return ".".join(map(str, release))


def _below(version: Version) -> str | None:
    """A version just below ``version`` (``0.32`` -> ``0.31.99999``), None below ``0``."""
    release = list(version.release)
    while release and release[-1] == 0:
        release.pop()
    if not release:
        return None
    release[-1] -= 1
    return ".".join(map(str, [*release, 99999]))


def _above(version: Version) -> str:
    """A version just above ``version`` and below any other bound (``0.32`` -> ``0.32.0.0.0.1``)."""
    release = list(version.release) + [0] * 5
    return ".".join(map(str, [*release[:5], 1]))


def _platforms_of(condition: NameMatch | None, platforms: Iterable[str]) -> list[str]:
    """The domain platforms a rule's platform condition can match (all of them without one)."""
    if condition is None:
        return list(platforms)
    return [p for p in platforms if condition.matches(p)]


def _representatives(condition: NameMatch) -> list[str]:
    """The literal names of a name condition, and for each glob one name it matches."""
    names = sorted(condition.literals)
    for pattern in condition.patterns:
        if is_glob(pattern):
            glob = NameMatch.of(condition.key, (pattern,))
            witness = next((w for w in _glob_witnesses(pattern) if glob.matches(w)), None)
            if witness is not None:
                names.append(witness)
    return names


def _glob_witnesses(pattern: str) -> list[str]:
    """Candidate names matching ``pattern``: ``*`` as nothing or one letter, ``?`` as a letter,
    ``[...]`` as a member of the class. The caller keeps the first the engine's matcher accepts."""
    out = []
    for star in ("", "x"):
        text, i = "", 0
        while i < len(pattern):
            char = pattern[i]
            if char == "*":
                text += star
            elif char == "?":
                text += "x"
            elif char == "[" and "]" in pattern[i + 2 :]:
                end = pattern.index("]", i + 2)
                members = pattern[i + 1 : end]
                negated = members[0] in "!^"
                text += "x" if negated else members[0]
                i = end
            else:
                text += char
            i += 1
        out.append(text)
    return out


def _env_states(policies: tuple[Policy, ...]) -> tuple[EnvState, ...]:
    values: dict[str, dict[str, None]] = {}
    for policy in policies:
        for name, binding in policy.env.items():
            values.setdefault(name, {}).update(dict.fromkeys(binding.values))
    return ((), *(((name, v),) for name, vs in values.items() for v in vs))


def _feature_states(policies: tuple[Policy, ...]) -> tuple[FeatureState, ...]:
    per_feature: dict[str, list[Any]] = {}
    for policy in policies:
        for rule in policy.rules:
            for condition in rule.when.conditions:
                if isinstance(condition, FeatureMatch):
                    known = per_feature.setdefault(condition.key, [])
                    for value in _feature_values(condition):
                        if not any(_same(value, k) for k in known):
                            known.append(value)
    if not per_feature:
        return ((),)
    keys = list(per_feature)
    choices = [[None, *per_feature[k]] for k in keys]
    states = []
    for combo in itertools.product(*choices):
        states.append(tuple((k, v) for k, v in zip(keys, combo, strict=True) if v is not None))
    return tuple(states)


def _feature_values(condition: FeatureMatch) -> list[Any]:
    """Values on both sides of each comparison of one feature condition."""
    out: list[Any] = []
    for op, wanted in condition.ops:
        for value in wanted if op == "in" else (wanted,):
            if isinstance(value, bool):
                out.extend((value, not value))
            elif isinstance(value, (int, float)):
                out.extend((value - 1, value, value + 1))
            else:
                out.extend((value, OTHER_STRING))
    return out


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b)
