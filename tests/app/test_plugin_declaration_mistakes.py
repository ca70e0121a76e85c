"""Issue 24 item 11: ``policy plugins`` imports each runner's factory and says so (a typo
fails there, not at run time), and a plugin that provides nothing gets a warning naming the
missing ``@hookimpl`` marker."""

from __future__ import annotations

UNMARKED = """
from interlock.plugins import PlatformSupport, RunnerSpec

def interlock_runner_specs():
    return [RunnerSpec(name="myrunner", description="d", plugin_api=">=1.0,<2",
                       platforms={"cpu": PlatformSupport(cudagraph={"none"})},
                       factory="wf_unmarked:MyRunner")]
"""
TYPO = """
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl

@hookimpl
def interlock_runner_specs():
    return [RunnerSpec(name="myrunner", description="d", plugin_api=">=1.0,<2",
                       platforms={"cpu": PlatformSupport(cudagraph={"none"})},
                       factory="wf_typo_factory:MyRuner")]

class MyRunner:
    pass
"""


def test_a_missing_hookimpl_is_a_warning_naming_it(cli, install) -> None:
    install("my-runner", {"mine": "wf_unmarked"}, {"wf_unmarked": UNMARKED})
    res = cli("plugins")
    assert "provides nothing (warning: see below)" in res.out
    (warning,) = [x for x in res.err.splitlines() if x.startswith("policy: warning:")]
    assert "plugin mine (my-runner 1.0) provides nothing" in warning
    assert "interlock_runner_specs (" in warning and "wf_unmarked.py:4)" in warning
    assert "not marked @hookimpl" in warning
    doc = cli("plugins", "--json").json()
    assert any("not marked @hookimpl" in w for w in doc["warnings"])


def test_a_factory_typo_fails_policy_plugins(cli, install) -> None:
    install("my-runner", {"mine": "wf_typo_factory"}, {"wf_typo_factory": TYPO})
    res = cli("plugins", "--json")
    assert res.code == 1
    doc = res.json()
    (record,) = [p for p in doc["plugins"] if p["distribution"] == "my-runner"]
    assert "wf_typo_factory:MyRuner is not importable" in record["factories"]["myrunner"]
    assert any("runner 'myrunner'" in p and "MyRuner" in p for p in doc["problems"])
    text = cli("plugins")
    assert "factory import         ok (imported)" in text.out  # the built-ins'


def test_builtin_factories_are_imported_and_ok(cli) -> None:
    doc = cli("plugins", "--json").json()
    plugins = doc["plugins"]
    builtin = {p["name"]: p["factories"] for p in plugins if p["distribution"] == "interlock"}
    assert builtin == {"mrv1": {"mrv1": "ok"}, "mrv2": {"mrv2": "ok"}}
