from __future__ import annotations

from policy_texts import with_rules

from interlock.policy import load_policy_text
from interlock.policy.domain import UNNAMED_DEVICE_ARCH, Domain

RULES = """\
  - id: gfx
    when:
      platform: rocm
      device_arch: [gfx950, 'gfx9*']
      features: {tensor_parallel_size: {gt: 1}}
    set: {runner: mrv1}
    reason: a rule on ROCm device archs
  - id: anywhere
    when: {device_arch: 'sm_1[02]0', platform: [cuda, tpu]}
    set: {cudagraph: piecewise}
    reason: a rule on CUDA device archs
  - id: named
    when: {architecture: [DsaA, Uncatalogued, 'Gqa*']}
    set: {compile: false}
    reason: a rule naming an architecture outside the catalog
"""


def domain() -> Domain:
    return Domain.of(load_policy_text(with_rules(RULES)))


def test_architectures_are_the_catalog_plus_literal_names() -> None:
    archs = domain().architectures
    assert archs[:7] == ("DsaA", "DsaB", "DsaC", "GqaA", "GqaB", "MlaA", "LinA")
    assert archs[7:] == ("Uncatalogued",)


def test_device_archs_pair_with_the_platforms_their_rule_can_match() -> None:
    d = domain()
    assert d.platforms == ("cuda", "rocm", "xpu", "cpu", "tpu")
    assert d.device_archs["rocm"] == ("gfx9", "gfx950", UNNAMED_DEVICE_ARCH)
    assert d.device_archs["cuda"] == ("sm_100", UNNAMED_DEVICE_ARCH)
    assert d.device_archs["tpu"] == ("sm_100", UNNAMED_DEVICE_ARCH)
    assert d.device_archs["cpu"] == (UNNAMED_DEVICE_ARCH,)


def test_features_take_values_on_each_side_of_a_threshold_and_not_given() -> None:
    assert domain().feature_states == (
        (),
        (("tensor_parallel_size", 0),),
        (("tensor_parallel_size", 1),),
        (("tensor_parallel_size", 2),),
    )


def test_env_states_are_unset_then_one_binding_value_at_a_time() -> None:
    assert domain().env_states == ((), (("USE_V2", "0"),), (("USE_V2", "1"),))


def test_size_counts_every_context() -> None:
    d = domain()
    assert d.size() == len(list(d.contexts()))
    assert d.size(with_env=False) == len(list(d.contexts(with_env=False))) == d.size() // 3


def test_platforms_of_a_rule() -> None:
    policy = load_policy_text(with_rules(RULES))
    d = Domain.of(policy)
    assert d.platforms_of(policy.rules[0].when) == ("rocm",)
    assert d.platforms_of(policy.rules[1].when) == ("cuda", "tpu")
    assert d.platforms_of(policy.rules[2].when) == d.platforms
