"""`policy check` findings that come from the plugin registry."""

from __future__ import annotations

from plugin_builders import EAGER_ONLY, Declares, spec

from interlock.plugins.checks import lint_sources

POLICY = """\
schema_version: 1
version: "t"
catalog:
  Dense: {moe: false, attention: gqa}
defaults: {runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}
rules:
  - id: tiny-runs-eager
    when: {architecture: Dense}
    set: {runner: tiny, cudagraph: full}
    reason: the tiny runner is enough for the dense test model
"""


def codes(findings: list) -> list[tuple[str, str]]:
    return [
        (f.code, f.message)
        for f in findings
        if f.code in ("unknown-runner", "unsupported-cudagraph")
    ]


def test_rule_sets_a_mode_its_runner_never_serves(register_plugin) -> None:  # type: ignore[no-untyped-def]
    register_plugin(Declares(spec("tiny", {"cpu": EAGER_ONLY, "cuda": EAGER_ONLY})), "tiny-plugin")
    found = codes(lint_sources([("site.yaml", POLICY.encode())]))
    assert [c for c, _ in found] == ["unsupported-cudagraph"]
    assert found[0][1].startswith(
        "rule tiny-runs-eager: runner tiny does not serve cudagraph=full on cuda (tiny serves "
        "none): stage 5 downgrades it there; runner tiny does not serve platform rocm"
    )


def test_without_the_plugin_the_runner_is_unknown() -> None:
    found = codes(lint_sources([("site.yaml", POLICY.encode())]))
    assert [c for c, _ in found] == ["unknown-runner"]
    assert "runner 'tiny' is not registered" in found[0][1]
