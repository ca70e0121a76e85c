"""The policy texts the tests build on: one minimal policy, and the rules a test adds to it
(importable from every test module)."""

from __future__ import annotations

_HEAD = """\
schema_version: 1
version: "t1"
catalog:
"""
_DEFAULTS = """\
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2}}
"""

#: The minimal valid policy without its rules: two architectures (one DSA MoE, one dense
#: GQA), the defaults, one env binding; see :func:`with_rules`.
MINIMAL_BASE = _HEAD + """\
  DsaModel: {moe: true, attention: dsa}
  DenseModel: {moe: false, attention: gqa}
""" + _DEFAULTS

#: The same with a catalog of three families and every attention kind, for the rules of the
#: lint, diff and domain tests.
BASE = _HEAD + """\
  DsaA: {family: a, moe: true, attention: dsa}
  DsaB: {family: b, moe: true, attention: dsa}
  DsaC: {family: c, moe: true, attention: dsa}
  GqaA: {family: a, moe: false, attention: gqa}
  GqaB: {family: b, moe: false, attention: gqa}
  MlaA: {family: a, moe: true, attention: mla}
  LinA: {family: c, moe: false, attention: linear}
""" + _DEFAULTS


def with_rules(rules: str = "", base: str = BASE) -> str:
    """``base`` plus a ``rules:`` block (YAML list items indented by two spaces)."""
    return base + ("rules:\n" + rules if rules.strip() else "rules: []\n")


#: The minimal complete policy: MINIMAL_BASE without rules.
MINIMAL = with_rules(base=MINIMAL_BASE)
