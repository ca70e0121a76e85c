"""Suggestions for misspelt names: the closest candidate by edit distance.

Case is ignored when measuring (``GlmMoeDSAForCausalLM`` is as close as can be to
``GlmMoeDsaForCausalLM``, not two edits away) and used only to break ties.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Words longer than this get no suggestion (names are short; a 100 KB word is not a typo).
MAX_WORD = 256
#: At most this many candidates are measured (those sharing the first two letters, when a
#: catalog has more), so a suggestion costs milliseconds whatever the catalog's size.
MAX_CANDIDATES = 2000


def edit_distance(a: str, b: str) -> int:
    """Edits turning ``a`` into ``b``: insertions, deletions, substitutions and swaps of two
    adjacent characters (``mvr2`` -> ``mrv2``), each costing 1 (optimal string alignment)."""
    before: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            cost = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, before[j - 2] + 1)
            current.append(cost)
        before, previous = previous, current
    return previous[-1]


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word``, or None when none is plausibly a misspelling.

    Plausible means at most one edit per three characters of ``word`` (at least one),
    ignoring case. ``word`` itself is never suggested. The search is bounded (see
    :data:`MAX_WORD`, :data:`MAX_CANDIDATES`).
    """
    if len(word) > MAX_WORD:
        return None  # no name is that long: nothing is a plausible misspelling of it
    budget = max(1, len(word) // 3)
    lowered = word.lower()
    best: tuple[int, int, str] | None = None
    # A length gap over the budget rules a candidate out for free; the rest are bounded
    # in number, so a huge catalog or a huge word never makes an error slow.
    near = [c for c in candidates if abs(len(c) - len(word)) <= budget and c != word]
    if len(near) > MAX_CANDIDATES:
        head = lowered[:2]
        near = [c for c in near if c[:2].lower() == head][:MAX_CANDIDATES]
    for candidate in near:
        distance = edit_distance(lowered, candidate.lower())
        if distance > budget:
            continue
        key = (distance, edit_distance(word, candidate), candidate)
        if best is None or key < best:
            best = key
    return None if best is None else best[2]


def hint(word: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'X'?)"`` for the closest candidate, or an empty string."""
    match = did_you_mean(word, candidates)
    return f" (did you mean {match!r}?)" if match else ""
