"""An index of rules, so that a context only evaluates the rules that can match it.

Each rule is filed under one *primary* condition, the most selective it has:
its architecture (literal names and globs), else its first trait condition,
else its platform, else "always". A context's candidates are the buckets its
architecture, traits and platform select, merged back into file order, so
"later wins per field" is unaffected. Every candidate is then evaluated in
full; a rule the index skips fails its primary condition, so it cannot match.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from interlock.policy.conditions import NameMatch, TraitMatch, is_glob
from interlock.policy.model import Rule

_CACHE_LIMIT = 4096


@dataclass
class RuleIndex:
    by_architecture: dict[str, tuple[int, ...]]
    architecture_globs: tuple[tuple[NameMatch, tuple[int, ...]], ...]
    #: (trait, value) -> rules whose primary condition accepts that value.
    by_trait: dict[tuple[str, Any], tuple[int, ...]]
    by_platform: dict[str, tuple[int, ...]]
    platform_globs: tuple[tuple[NameMatch, tuple[int, ...]], ...]
    always: tuple[int, ...]
    _cache: dict[Any, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, rules: tuple[Rule, ...]) -> RuleIndex:
        by_arch: dict[str, list[int]] = {}
        arch_globs: dict[str, list[int]] = {}
        by_trait: dict[tuple[str, Any], list[int]] = {}
        by_platform: dict[str, list[int]] = {}
        platform_globs: dict[str, list[int]] = {}
        always: list[int] = []
        for rule in rules:
            arch = rule.when.name_match("architecture")
            trait = next((c for c in rule.when.conditions if isinstance(c, TraitMatch)), None)
            platform = rule.when.name_match("platform")
            if arch is not None:
                _file(rule.index, arch, by_arch, arch_globs)
            elif trait is not None:
                for value in dict.fromkeys(trait.values):
                    by_trait.setdefault((trait.key, _key(value)), []).append(rule.index)
            elif platform is not None:
                _file(rule.index, platform, by_platform, platform_globs)
            else:
                always.append(rule.index)
        return cls(
            {k: tuple(v) for k, v in by_arch.items()},
            _globs("architecture", arch_globs),
            {k: tuple(v) for k, v in by_trait.items()},
            {k: tuple(v) for k, v in by_platform.items()},
            _globs("platform", platform_globs),
            tuple(always),
        )

    def candidates(
        self, architecture: str, platform: str, traits: Mapping[str, Any]
    ) -> tuple[int, ...]:
        """Indices, in file order, of the rules that may match these facts."""
        key = (architecture, platform, tuple(sorted(traits.items())))
        found = self._cache.get(key)
        if found is None:
            lists = [self.always, self.by_architecture.get(architecture, ())]
            lists += [ids for m, ids in self.architecture_globs if m.matches(architecture)]
            lists += [self.by_trait.get((k, _key(v)), ()) for k, v in traits.items()]
            lists.append(self.by_platform.get(platform, ()))
            lists += [ids for m, ids in self.platform_globs if m.matches(platform)]
            found = tuple(sorted(set().union(*lists)))
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = found
        return found

    def clear_cache(self) -> None:
        """Forget the candidates worked out so far (benchmarks measure the cold path)."""
        self._cache.clear()


def _key(value: Any) -> Any:
    # Keep True and 1 apart, as conditions do.
    return (type(value) is bool, value)


def _file(
    index: int, match: NameMatch, literals: dict[str, list[int]], globs: dict[str, list[int]]
) -> None:
    for pattern in dict.fromkeys(match.patterns):
        (globs if is_glob(pattern) else literals).setdefault(pattern, []).append(index)


def _globs(key: str, globs: dict[str, list[int]]) -> tuple[tuple[NameMatch, tuple[int, ...]], ...]:
    return tuple((NameMatch.of(key, (pattern,)), tuple(ids)) for pattern, ids in globs.items())
