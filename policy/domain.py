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
  binding at a time.

Two policies are compared over the union of their domains.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from interlock.core.platform import PLATFORM_NAMES
from interlock.policy.conditions import FeatureMatch, NameMatch, When, is_glob
from interlock.policy.context import Context
from interlock.policy.model import Policy

#: The device arch standing for "any arch no rule names".
UNNAMED_DEVICE_ARCH = ""
#: A string no compared value equals, for `ne`/`in` conditions on string features.
OTHER_STRING = "(other)"

EnvState = tuple[tuple[str, str], ...]
FeatureState = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Domain:
    architectures: tuple[str, ...]
    #: Platform -> its device archs, the unnamed one last.
    device_archs: dict[str, tuple[str, ...]]
    #: ``()`` (nothing set) first, then one ``((name, value),)`` per declared value.
    env_states: tuple[EnvState, ...]
    #: ``()`` (no feature given) first, then every combination of feature values.
    feature_states: tuple[FeatureState, ...]

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
        return cls(
            architectures=tuple(archs),
            device_archs=device_archs,
            env_states=_env_states(policies),
            feature_states=_feature_states(policies),
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

    def contexts(self, *, with_env: bool = True) -> Iterator[Context]:
        """Every context of the domain; ``with_env=False`` leaves the environment empty
        (enough to see which rules match: env bindings act after the rules)."""
        envs = self.env_states if with_env else ((),)
        places = list(self.places())
        for arch in self.architectures:
            for platform, device_arch in places:
                for features in self.feature_states:
                    for env in envs:
                        yield Context(
                            architecture=arch,
                            platform=platform,
                            device_arch=device_arch,
                            features=dict(features),
                            env=dict(env),
                        )

    def size(self, *, with_env: bool = True) -> int:
        envs = len(self.env_states) if with_env else 1
        places = sum(len(archs) for archs in self.device_archs.values())
        return len(self.architectures) * places * len(self.feature_states) * envs


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
