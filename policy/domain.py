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

Features, config, model and engine states are enumerated per (architecture, platform,
device arch) over the rules whose name conditions can hold there: a condition of a rule
that cannot match a place makes no distinction in it. Each feature or config key is
reduced to one value per truth assignment of its own conditions before keys are
combined. Past :data:`MAX_STATES` combinations of one kind, or :data:`MAX_EXTRAS` of all
four at one place, the enumeration is bounded and says so (:attr:`Domain.bounded`): none
given, each key's values alone, and each rule's conditions together, rather than every
combination of every key.

Two policies are compared over the union of their domains.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from interlock.core.platform import PLATFORM_NAMES
from interlock.policy.conditions import (
    Condition,
    ConfigMatch,
    EngineMatch,
    Facts,
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
#: The most states of one kind (features, config) enumerated in full.
MAX_STATES = 64
#: The most combinations of the four kinds enumerated in full at one place.
MAX_EXTRAS = 256
#: The conditions on features, config, model identity and engine versions.
_EXTRA_KINDS = (FeatureMatch, ConfigMatch, ModelMatch, EngineMatch)


@dataclass(frozen=True)
class Domain:
    architectures: tuple[str, ...]
    #: Platform -> its device archs, the unnamed one last.
    device_archs: dict[str, tuple[str, ...]]
    #: ``()`` (nothing set) first, then one ``((name, value),)`` per declared value.
    env_states: tuple[EnvState, ...]
    #: ``()`` (no feature given) first, then the combinations of feature values (every rule).
    feature_states: tuple[FeatureState, ...]
    #: None (no model config) first, then one config per truth assignment of the predicates.
    config_states: tuple[ConfigState, ...] = (None,)
    model_states: tuple[ModelState, ...] = ((),)
    engine_states: tuple[EngineState, ...] = ((),)
    #: The config predicates the states were enumerated over, as written (``config.x > 70``).
    config_predicates: tuple[str, ...] = ()
    #: Where the enumeration stops short of every combination, in words (empty: it does not).
    bounded: tuple[str, ...] = ()
    #: Every rule's `when`, for the states of each place (:meth:`extras_at`).
    whens: tuple[When, ...] = field(default=(), repr=False, compare=False)
    _memo: dict[Any, list[Extra]] = field(default_factory=dict, repr=False, compare=False)

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
        whens = tuple(rule.when for policy in policies for rule in policy.rules)
        states = _states(whens)
        configs = [c for w in whens for c in _all(w) if isinstance(c, ConfigMatch)]
        return cls(
            architectures=tuple(archs),
            device_archs=device_archs,
            env_states=_env_states(policies),
            feature_states=states.kinds[0],
            config_states=states.kinds[1],
            model_states=states.kinds[2],
            engine_states=states.kinds[3],
            config_predicates=tuple(dict.fromkeys(predicate_text(c) for c in configs)),
            bounded=states.bounded,
            whens=whens,
        )

    def engine_text(self, engine: str, version: str) -> str:
        """The releases ``version`` stands for in the domain, as ranges between the bounds the
        engine conditions name (``vllm >=0.30,<0.34``; ``vllm <0.29 or >=0.34`` where two
        ranges behave alike): a representative is not a release of its own."""
        key = ("engine_text", engine, version)
        if key not in self._memo:
            matches = [c for w in self.whens for c in _all(w)
                       if isinstance(c, EngineMatch) and c.engine == engine]
            self._memo[key] = [_range_text(engine, version, matches)]  # type: ignore[list-item]
        return str(self._memo[key][0])

    def extras_at(self, architecture: str, platform: str, device_arch: str) -> list[Extra]:
        """The feature, config, model and engine states at one place: over the conditions
        of the rules whose name conditions hold there."""
        here = {"architecture": architecture, "platform": platform, "device_arch": device_arch}
        relevant = tuple(
            i for i, when in enumerate(self.whens)
            if all(c.matches(here[c.key]) for c in _all(when) if isinstance(c, NameMatch))
        )
        hit = self._memo.get(relevant)
        if hit is None:
            hit = self._memo[relevant] = _states(tuple(self.whens[i] for i in relevant)).extras
        return hit
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
                for features, config, model, engine in self.extras_at(arch, platform,
                                                                      device_arch):
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
        return envs * sum(
            len(self.extras_at(arch, platform, device_arch))
            for arch in self.architectures for platform, device_arch in self.places()
        )

    def describe_size(self) -> str:
        """Where the contexts come from, as a product in words, for a refusal."""
        places = sum(len(archs) for archs in self.device_archs.values())
        return (f"{len(self.architectures)} architectures x {places} platforms and device archs "
                f"x {len(self.env_states)} env states x up to {len(self.feature_states)} "
                f"feature, {len(self.config_states)} config, {len(self.model_states)} model and "
                f"{len(self.engine_states)} engine states")

    def describe_enumeration(self) -> list[str]:
        """What the domain enumerates beyond the catalog, in words, for reports (where it is
        bounded, first)."""
        lines = [f"bounded: {note}" for note in self.bounded]
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
                " ".join(self.engine_text(e, v) for e, v in s) for s in self.engine_states[1:]
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


@dataclass(frozen=True)
class _States:
    """The states of each kind over some rules, their combinations, and where bounded."""

    kinds: tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]
    extras: list[Extra]
    bounded: tuple[str, ...]


def _states(whens: tuple[When, ...]) -> _States:
    """The four kinds of states over the conditions of ``whens``, and their combinations:
    all of them, or (past :data:`MAX_EXTRAS`) each kind's states with the others at their
    first, plus one combination per rule in which all its conditions hold."""
    notes: list[str] = []
    conditions = [c for when in whens for c in _all(when)]
    features = _keyed_states([c for c in conditions if isinstance(c, FeatureMatch)], whens,
                             "features", notes)
    on_config = [c for c in conditions if isinstance(c, ConfigMatch)]
    kinds = (
        features,
        (None, *_keyed_states(on_config, whens, "config", notes)) if on_config else (None,),
        _model_states([c for c in conditions if isinstance(c, ModelMatch)]),
        _engine_states([c for c in conditions if isinstance(c, EngineMatch)]),
    )
    total = 1
    for states in kinds:
        total *= len(states)
    if total <= MAX_EXTRAS:
        extras: list[Extra] = list(itertools.product(*kinds))
        return _States(kinds, extras, tuple(notes))
    first = tuple(states[0] for states in kinds)
    chosen: dict[Extra, None] = {}
    for i, states in enumerate(kinds):
        for state in states:
            chosen[first[:i] + (state,) + first[i + 1:]] = None  # type: ignore[index]
    for when in whens:
        # A rule whose conditions are all of one kind matches in that kind's states alone.
        if len({type(c) for c in _all(when) if isinstance(c, _EXTRA_KINDS)}) < 2:
            continue
        witness = tuple(
            next((s for s in states if _kind_holds(when, i, s)), None)
            for i, states in enumerate(kinds)
        )
        if all(w is not None or i == 1 for i, w in enumerate(witness)):
            chosen[witness] = None  # type: ignore[index]
    notes.append(
        f"{' x '.join(str(len(k)) for k in kinds)} = {total} combinations of feature, config, "
        f"model and engine states at one place, over the bound of {MAX_EXTRAS}: enumerated "
        f"{len(chosen)} (each kind's states alone, and each rule's conditions of several "
        "kinds together)"
    )
    return _States(kinds, list(chosen), tuple(notes))


def _kind_holds(when: When, kind: int, state: Any) -> bool:
    """Whether ``when``'s conditions of one kind (features, config, model, engine) hold in
    ``state`` of that kind."""
    facts = Facts(
        "", "", "", {},
        dict(state) if kind == 0 else {},
        (None if state is None else dict(state)) if kind == 1 else None,
        state if kind == 2 else (),
        dict(state) if kind == 3 else {},
    )
    return all(c.holds(facts) for c in _all(when) if isinstance(c, _EXTRA_KINDS[kind]))


def _keyed_states(
    conditions: list[Any], whens: tuple[When, ...], kind: str, notes: list[str]
) -> tuple[Any, ...]:
    """Feature or config states: for features "none given" first and each key absent first,
    for config (whose "no model config" the caller adds) each key absent last.

    Small enough, every combination of the keys' witness values (features) or of one value
    per truth assignment of each key's conditions (config, and features past
    :data:`MAX_STATES`); else (bounded, noted) every key absent, each key's values alone,
    and each rule's conditions together."""
    is_feature = kind == "features"
    if not conditions:
        return ((),)
    witnesses: dict[str, list[Any]] = {}
    for condition in conditions:
        known = witnesses.setdefault(condition.key, [])
        for value in _feature_values(FeatureMatch(condition.key, condition.ops)):
            if not any(_same(value, k) for k in known):
                known.append(value)
    keys = list(witnesses)
    # A feature not given comes first; a config path absent last (a present value shows a
    # branch more plainly).
    raw = {k: [None, *witnesses[k]] if is_feature else [*witnesses[k], None] for k in keys}
    raw_total = 1
    for k in keys:
        raw_total *= len(raw[k])
    if is_feature and raw_total <= MAX_STATES:
        choices = raw
    else:
        choices = {k: _distinct(raw[k], [c for c in conditions if c.key == k]) for k in keys}
    total = 1
    for k in keys:
        total *= len(choices[k])
    if total <= MAX_STATES:
        return tuple(
            tuple((k, v) for k, v in zip(keys, combo, strict=True) if v is not None)
            for combo in itertools.product(*(choices[k] for k in keys))
        )
    states: dict[tuple[tuple[str, Any], ...], None] = {(): None}
    for k in keys:
        for value in choices[k]:
            states[() if value is None else ((k, value),)] = None
    kind_type = FeatureMatch if is_feature else ConfigMatch
    for when in whens:
        mine = [c for c in _all(when) if isinstance(c, kind_type)]
        if len({c.key for c in mine}) < 2:  # one key: its values alone show the rule match
            continue
        witness = []
        for k in dict.fromkeys(c.key for c in mine):
            value = next((v for v in choices[k] if v is not None and all(
                c.value_holds(v) if isinstance(c, ConfigMatch) else _feature_holds(c, v)
                for c in mine if c.key == k)), None)
            if value is None:
                break
            witness.append((k, value))
        else:
            if witness:
                states[tuple(witness)] = None
    kept = _one_per_outcome(states, whens, 0 if is_feature else 1)
    notes.append(
        f"{kind}: {len(keys)} keys whose distinctions make {total} combinations, over the "
        f"bound of {MAX_STATES}: enumerated {len(kept)} (none given, each key's values "
        "alone, and each rule's conditions on several keys together, one state per set of "
        "rules whose conditions of this kind hold)"
    )
    return kept


def _one_per_outcome(
    states: Iterable[tuple[tuple[str, Any], ...]], whens: tuple[When, ...], kind: int
) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """The first of ``states`` for each set of ``whens`` whose conditions of ``kind`` all
    hold in it. Conditions see a state only through those sets (a rule matches where all its
    conditions hold), so two states with the same set resolve alike in every context: the
    others are left out. A key read by one rule alone, say, has its values alone shown by
    the state with no key given."""
    reading = [w for w in whens if any(isinstance(c, _EXTRA_KINDS[kind]) for c in _all(w))]
    seen: set[tuple[bool, ...]] = set()
    kept = []
    for state in states:
        outcome = tuple(_kind_holds(when, kind, state) for when in reading)
        if outcome not in seen:
            seen.add(outcome)
            kept.append(state)
    return tuple(kept)


def _feature_holds(condition: FeatureMatch, value: Any) -> bool:
    return condition.holds(Facts("", "", "", {}, {condition.key: value}))


def _distinct(values: list[Any], conditions: list[Any]) -> list[Any]:
    """The first of ``values`` (None: the key absent) per truth assignment of
    ``conditions`` on that key."""
    seen: set[tuple[bool, ...]] = set()
    out = []
    for value in values:
        facts_value = {} if value is None else {conditions[0].key: value}
        truth = tuple(
            (value is not None and c.value_holds(value)) if isinstance(c, ConfigMatch)
            else c.holds(Facts("", "", "", {}, facts_value))
            for c in conditions
        )
        if truth not in seen:
            seen.add(truth)
            out.append(value)
    return out


def config_states(conditions: list[ConfigMatch]) -> tuple[ConfigState, ...]:
    """No model config, then one config per distinct truth assignment of ``conditions`` (the
    all-false one included: a config that fails every predicate is not "no config"), bounded
    as :func:`_keyed_states` says."""
    if not conditions:
        return (None,)
    return (None, *_keyed_states(conditions, (), "config", []))


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


def _range_text(engine: str, version: str, matches: list[EngineMatch]) -> str:
    """``vllm >=0.30,<0.34``: the ranges between ``matches``' bounds whose versions every
    condition judges as it judges ``version``."""
    bounds = sorted({b for m in matches for spec in m.spec for b in _bounds(spec)})
    if not bounds:
        return f"{engine} {version}"

    def truth(v: str) -> tuple[bool, ...]:
        return tuple(m.version_holds(v) for m in matches)

    wanted = truth(version)
    # Segment i holds the versions from bounds[i-1] (included) up to bounds[i] (excluded).
    inside = [str(bounds[0]) if _below(bounds[0]) is None else _below(bounds[0])]
    inside += [str(b) for b in bounds]
    parts = []
    for i, witness in enumerate(inside):
        if witness is None or truth(witness) != wanted:
            continue
        low = f">={bounds[i - 1]}" if i > 0 else ""
        high = f"<{bounds[i]}" if i < len(bounds) else ""
        parts.append(",".join(p for p in (low, high) if p) or "any")
    return f"{engine} " + (" or ".join(parts) if parts else version)


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
