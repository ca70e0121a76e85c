"""The Python API's default: the policy decides, as `policy run` does, and says who chose what."""

from __future__ import annotations

import logging
import os
import re

import pytest

from interlock.app.decided_by import decided_by
from interlock.core.errors import PolicyError
from interlock.llm import LLM
from interlock.plugins.capabilities import CapabilityError
from interlock.policy.loader import shipped_policy_path
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.contract import Decision
from interlock.runners.mrv1.runner import MRV1Runner

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GREEDY = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
SITE_MRV1 = (
    'schema_version: 1\nversion: "site"\nrules:\n'
    "  - {id: site-llama-on-mrv1, when: {architecture: LlamaForCausalLM},"
    " set: {runner: mrv1, cudagraph: none}, reason: site says so}\n"
)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_POLICY", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH"):
        monkeypatch.delenv(name, raising=False)


def make_llm(tiny_models, **kwargs) -> LLM:
    return LLM(str(tiny_models.path("llama")), num_blocks=16, max_model_len=32, max_num_seqs=2,
               max_num_batched_tokens=16, **kwargs)


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "interlock"]


def test_the_default_decision_is_the_policys_logged_with_who_chose_each_field(
    tiny_models, caplog, cli
):
    caplog.set_level(logging.INFO, logger="interlock")
    llm = make_llm(tiny_models)
    resolution = llm.resolution
    decision = resolution.decision
    report = llm.report()
    assert (report.runner, report.cudagraph) == (decision.runner, decision.cudagraph)
    assert (decision.runner, decision.cudagraph) == ("mrv2", "full_and_piecewise")
    for name in ("runner", "cudagraph", "breakable"):
        prov = resolution.provenance[name]
        assert prov.stage == "defaults" and prov.location.file == "policies.yaml"
    assert resolution.context.sources["architecture"].startswith("model config")
    assert resolution.context.sources["platform"].startswith("detected")
    [line] = logged(caplog)
    assert line == f"LLM {tiny_models.path('llama')}: {decided_by(resolution)}"
    assert re.search(r"runner=mrv2 \(defaults, policies\.yaml:\d+\), cudagraph="
                     r"full_and_piecewise \(defaults, policies\.yaml:\d+\), breakable=false "
                     r"\(defaults, policies\.yaml:\d+\)$", line)
    resolved = cli("resolve", "--model", tiny_models.path("llama")).json()
    assert resolution.to_dict()["decision"] == resolved["decision"]
    assert len(llm.generate([[4, 5, 6]], GREEDY)[0].token_ids) == GREEDY.max_tokens


def test_an_explicit_decision_is_logged_as_given_by_the_caller(tiny_models, caplog):
    caplog.set_level(logging.INFO, logger="interlock")
    llm = make_llm(tiny_models, decision=Decision("mrv1"))
    assert llm.resolution is None and llm.report().runner == "mrv1"
    assert logged(caplog) == [
        f"LLM {tiny_models.path('llama')}: runner=mrv1 (given by the caller), cudagraph=none "
        "(given by the caller), breakable=false (given by the caller)"
    ]


def test_a_layered_site_policy_forces_mrv1(tiny_models, write, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="interlock")
    site = write("site.yaml", SITE_MRV1)
    llm = make_llm(tiny_models, policy=[shipped_policy_path(), site])
    prov = llm.resolution.provenance["runner"]
    assert (prov.stage, prov.source, prov.location.file) == ("rules", "site-llama-on-mrv1",
                                                             str(site))
    assert llm.report().runner == "mrv1" and llm.report().cudagraph == "none"
    assert f"runner=mrv1 (rules site-llama-on-mrv1, {site}:4)" in logged(caplog)[0]

    monkeypatch.setenv("INTERLOCK_POLICY", f"{shipped_policy_path()}{os.pathsep}{site}")
    assert make_llm(tiny_models).resolution.provenance["runner"].source == "site-llama-on-mrv1"


def test_the_process_environment_binding_picks_mrv1(tiny_models, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="interlock")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    llm = make_llm(tiny_models, device="cpu")
    resolution = llm.resolution
    prov = resolution.provenance["runner"]
    assert (prov.stage, prov.source, prov.value) == ("env", "VLLM_USE_V2_MODEL_RUNNER", "mrv1")
    assert resolution.context.sources["env.VLLM_USE_V2_MODEL_RUNNER"] == "process environment"
    assert resolution.context.sources["platform"] == "given (device='cpu')"
    assert llm.report().runner == "mrv1"
    assert "runner=mrv1 (env VLLM_USE_V2_MODEL_RUNNER, policies.yaml:" in logged(caplog)[0]


def test_resolution_errors_propagate_with_their_messages(tiny_models):
    with pytest.raises(CapabilityError, match="runner 'nope' is not registered; registered "
                       "runners: mrv1, mrv2"):
        make_llm(tiny_models, overrides={"runner": "nope"})
    with pytest.raises(CapabilityError, match="forced compile=true cannot be served"):
        make_llm(tiny_models, overrides={"compile": True})
    with pytest.raises(PolicyError, match="unknown decision field 'runnr'"):
        make_llm(tiny_models, overrides={"runnr": "mrv1"})


def test_what_cannot_be_combined_is_refused(tiny_models, write):
    with pytest.raises(ValueError, match="runner=MRV1Runner object given without a decision"):
        make_llm(tiny_models, runner=MRV1Runner())
    with pytest.raises(ValueError, match="with an explicit decision= they would be ignored"):
        make_llm(tiny_models, decision=Decision(), overrides={"runner": "mrv1"})
