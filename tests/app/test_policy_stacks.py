"""Issue 24 item 3: every command that takes a policy takes a stack (``a.yaml:b.yaml``, as
``INTERLOCK_POLICY`` writes it) and the ``@shipped`` alias, through one parser; ``policy diff``
answers "what does layering site.yaml change"."""

from __future__ import annotations

import os

import pytest

from interlock.core.errors import PolicyError
from interlock.policy.loader import SHIPPED_ALIAS, parse_stack, policy_paths, shipped_policy_path


def test_diff_shipped_against_shipped_with_the_site_layered(cli, site) -> None:
    res = cli("diff", "@shipped", f"@shipped{os.pathsep}{site}", "--json")
    assert res.code == 0, res.err
    doc = res.json()
    changes = doc["changes"]
    # MRV1 where the site decides it; Step5 there is refused (vLLM refuses MRV1 for it).
    assert [(c["field"], c["old"], c["new"]) for c in changes] == [
        ("outcome", "resolves", None), ("runner", "mrv2", "mrv1")
    ]
    refused = [ctx for d in changes[0]["deciders"] for ctx in d["contexts"]]
    assert {ctx["architecture"] for ctx in refused} == {
        "Step5ForCausalLM", "Step5ForConditionalGeneration"
    }
    assert doc["new"]["files"][-1] == str(site)
    contexts = [ctx for c in changes for d in c["deciders"] for ctx in d["contexts"]]
    assert {(ctx["platform"], ctx["device_arch"]) for ctx in contexts} == {("rocm", "gfx950")}
    text = cli("diff", "@shipped", f"@shipped{os.pathsep}{site}").out
    assert "rule site-mi355x-tp-mrv1" in text and "runner: mrv2 → mrv1" in text


def test_a_stack_and_repeated_policy_flags_are_one_policy(cli, site) -> None:
    argv = ("explain", "GlmMoeDsaForCausalLM", "--platform", "rocm", "--device-arch", "gfx950",
            "--feature", "tensor_parallel_size=8", "--json")
    stacked = cli(*argv, "--policy", f"{SHIPPED_ALIAS}{os.pathsep}{site}").json()
    repeated = cli(*argv, "--policy", SHIPPED_ALIAS, "--policy", site).json()
    assert stacked["decision"] == repeated["decision"]
    assert stacked["decision"]["runner"] == "mrv1"
    assert stacked["provenance"]["runner"]["source"] == "site-mi355x-tp-mrv1"


@pytest.mark.parametrize("command", ["check", "table", "conformance"])
def test_each_policy_taking_command_takes_a_stack(cli, site, command) -> None:
    stack = f"@shipped{os.pathsep}{site}"
    extra = {"conformance": ("conformance/vllm-0.33.0.jsonl",), "table": ("--format", "json")}
    res = cli(command, *extra.get(command, ()), "--policy", stack)
    assert "defaults must set" not in res.err
    assert res.code in (0, 1) and "Traceback" not in res.err
    if command == "check":
        assert res.code == 0, res.out


def test_interlock_policy_takes_the_alias(cli, site, monkeypatch) -> None:
    monkeypatch.setenv("INTERLOCK_POLICY", f"@shipped{os.pathsep}{site}")
    doc = cli("explain", "LlamaForCausalLM", "--platform", "rocm", "--device-arch", "gfx950",
              "--feature", "tensor_parallel_size=2", "--json").json()
    assert doc["decision"]["runner"] == "mrv1"
    assert [p for _, p in policy_paths()] == [shipped_policy_path(), site]


def test_an_unknown_alias_is_an_error_with_the_known_one() -> None:
    wanted = "unknown policy alias '@shiped'.*did you mean '@shipped'"
    with pytest.raises(PolicyError, match=wanted):
        parse_stack("@shiped", "--policy")


def test_git_sides_of_diff_still_work(cli) -> None:
    res = cli("diff", "git:HEAD", "@shipped", "--json")
    assert res.code == 0, res.err
