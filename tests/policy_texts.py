"""Policy texts the tests build on (importable from every test module)."""

from __future__ import annotations

#: A small complete policy: two catalog entries, one env binding, no rules.
MINIMAL = """\
schema_version: 1
version: "t1"
catalog:
  DsaModel: {moe: true, attention: dsa}
  DenseModel: {moe: false, attention: gqa}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2}}
rules: []
"""

#: A minimal valid policy without its rules; see :func:`with_rules`.
BASE = """\
schema_version: 1
version: "t1"
catalog:
  DsaA: {family: a, moe: true, attention: dsa}
  DsaB: {family: b, moe: true, attention: dsa}
  DsaC: {family: c, moe: true, attention: dsa}
  GqaA: {family: a, moe: false, attention: gqa}
  GqaB: {family: b, moe: false, attention: gqa}
  MlaA: {family: a, moe: true, attention: mla}
  LinA: {family: c, moe: false, attention: linear}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
env:
  USE_V2: {field: runner, values: {"0": mrv1, "1": mrv2}}
"""


def with_rules(rules: str = "", base: str = BASE) -> str:
    """``base`` plus a ``rules:`` block (YAML list items indented by two spaces)."""
    return base + ("rules:\n" + rules if rules.strip() else "rules: []\n")
