"""An index of rules by architecture and platform, so a context only looks at rules that can match.

Rules keep their file order: candidates come back sorted by rule index, so
"later wins per field" is unaffected by indexing. Rules the index skips fail on
architecture or platform, which are the first conditions checked anyway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import merge

from policy.conditions import NameMatch, is_glob
from policy.model import Rule

_ANY = ""


@dataclass
class RuleIndex:
    #: (architecture key, platform key) -> rule indices in file order. A key is a
    #: literal name, a glob, or "" for a rule without that condition.
    buckets: dict[tuple[str, str], tuple[int, ...]]
    arch_globs: dict[str, NameMatch]
    platform_globs: dict[str, NameMatch]
    _cache: dict[tuple[str, str], tuple[int, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, rules: tuple[Rule, ...]) -> RuleIndex:
        buckets: dict[tuple[str, str], list[int]] = {}
        arch_globs: dict[str, NameMatch] = {}
        platform_globs: dict[str, NameMatch] = {}
        for rule in rules:
            arch_keys = _keys(rule.when.name_match("architecture"), arch_globs)
            platform_keys = _keys(rule.when.name_match("platform"), platform_globs)
            for a in arch_keys:
                for p in platform_keys:
                    bucket = buckets.setdefault((a, p), [])
                    if not bucket or bucket[-1] != rule.index:
                        bucket.append(rule.index)
        return cls({k: tuple(v) for k, v in buckets.items()}, arch_globs, platform_globs)

    def candidates(self, architecture: str, platform: str) -> tuple[int, ...]:
        """Indices, in file order, of the rules whose architecture and platform may match."""
        key = (architecture, platform)
        found = self._cache.get(key)
        if found is None:
            archs = [architecture, _ANY, *_matching(self.arch_globs, architecture)]
            platforms = [platform, _ANY, *_matching(self.platform_globs, platform)]
            lists = [self.buckets.get((a, p), ()) for a in archs for p in platforms]
            found = tuple(_unique(merge(*lists)))
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = found
        return found

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state


def _keys(condition: NameMatch | None, globs: dict[str, NameMatch]) -> list[str]:
    if condition is None:
        return [_ANY]
    for pattern in condition.patterns:
        if is_glob(pattern) and pattern not in globs:
            globs[pattern] = NameMatch.of(condition.key, (pattern,))
    return list(dict.fromkeys(condition.patterns))


def _matching(globs: dict[str, NameMatch], value: str) -> list[str]:
    return [pattern for pattern, m in globs.items() if m.matches(value)]


def _unique(indices: object) -> list[int]:
    out: list[int] = []
    for i in indices:  # type: ignore[attr-defined]
        if not out or out[-1] != i:
            out.append(i)
    return out
