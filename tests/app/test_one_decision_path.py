"""Every reader decides through one path: for the same question, `policy explain`, `policy
table`, a replayed decision record, a `policy test` case and the vLLM plugin give the same
decision and the same trace."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interlock import decision_log
from interlock.app.query import Query, decide_query, process_env
from interlock.core.errors import PolicyError
from interlock.policy.loader import load_policy
from interlock.policy.policytest import run_case
from interlock.policy.resolution import PolicyRefused
from interlock.policy.testfile import parse_tests
from interlock.vllm.plugin import EngineFacts, PluginRefusal, plugin_decision
from interlock.vllm.stage import ReleaseStage, decide_with_release, stage_for

ROOT = Path(__file__).resolve().parents[2]
POLICY = str(ROOT / "policies.yaml")
BINDINGS = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH")
#: A name outside the catalog and far from every name in it (no did-you-mean refusal).
UNKNOWN = "NotInCatalogModel"
TARGETS = [("cuda", ""), ("cuda", "sm_90"), ("cuda", "sm_100"), ("rocm", ""),
           ("rocm", "gfx942"), ("rocm", "gfx950"), ("cpu", "")]
#: Releases interlock has read (decided through their engine stage), one it has not, none.
VERSIONS = [None, "0.29.0", "0.32.0", "0.33.0", "0.34.0", "0.30.1"]

def questions(versions: list[str | None]) -> st.SearchStrategy[dict[str, Any]]:
    """A question as every reader can put it: a model, a target, features, the policy's env
    bindings and an engine version among ``versions``."""
    return st.fixed_dictionaries({
        "architecture": st.sampled_from([
            "LlamaForCausalLM", "MixtralForCausalLM", "DeepseekV32ForCausalLM",
            "GlmMoeDsaForCausalLM", "KimiK3ForConditionalGeneration", "HYV4ForCausalLM", UNKNOWN,
        ]),
        "target": st.sampled_from(TARGETS),
        "features": st.fixed_dictionaries({}, optional={
            "has_triton": st.booleans(), "tensor_parallel_size": st.sampled_from([1, 2, 4]),
        }),
        "env": st.fixed_dictionaries({}, optional={
            name: st.sampled_from(["0", "1"]) for name in BINDINGS
        }),
        "vllm": st.sampled_from(versions),
    })


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("INTERLOCK_POLICY", "INTERLOCK_DECISION_LOG", *BINDINGS):
        monkeypatch.delenv(name, raising=False)


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _view(document: dict[str, Any]) -> dict[str, Any]:
    """A resolution's document without where its facts came from: each reader says in its
    own words who gave a fact ("given with --env", "given"), the same fact all the same."""
    document = {**document, "context": {k: v for k, v in document["context"].items()
                                        if k != "sources"}}
    return json.loads(_given(json.dumps(document)))


def _given(text: str) -> str:
    return re.sub(r"\(given[^()\"]*\)", "(given)", text)


def _error(message: str) -> tuple[str, str]:
    return "error", _given(message.split("\n")[0])


def _outcome(decide: Any) -> tuple[str, Any]:
    try:
        resolution = decide()
    except PolicyRefused as exc:
        return "refused", _view(json.loads(json.dumps(exc.resolution.to_dict())))
    except PolicyError as exc:
        return _error(str(exc))
    kind = "refused" if resolution.refusal is not None else "decided"
    return kind, _view(json.loads(json.dumps(resolution.to_dict())))


def _raise(exc: Exception) -> Any:
    raise exc


def _flags(q: dict[str, Any]) -> list[str]:
    platform, arch = q["target"]
    flags = ["--policy", POLICY, "--platform", platform]
    flags += ["--device-arch", arch] if arch else []
    for name, value in q["features"].items():
        flags += ["--feature", f"{name}={_shown(value)}"]
    for name, value in q["env"].items():
        flags += ["--env", f"{name}={value}"]
    flags += ["--engine-version", f"vllm={q['vllm']}"] if q["vllm"] else []
    return flags


def _explained(cli: Any, q: dict[str, Any]) -> tuple[str, Any]:
    shown = cli("explain", q["architecture"], *_flags(q), "--json")
    if shown.code not in (0, 5):
        return _error(json.loads(shown.out)["error"]["message"])
    document = json.loads(shown.out)
    return ("refused" if document["refusal"] else "decided"), _view(document)


def _tabled(cli: Any, q: dict[str, Any]) -> tuple[str, Any]:
    from interlock.policy import explain
    from interlock.policy.explain import TableError

    rows: list[Any] = []
    real = explain.render_table

    def kept(found: list[Any], fmt: str, *fields: Any) -> str:
        rows.extend(found)
        return real(found, fmt, *fields)

    with mock.patch.object(explain, "render_table", kept):
        cli("table", "-a", q["architecture"], *_flags(q), "--format", "json")
    # The row of no model config, the question explain answers without --model.
    (row,) = [r for r in rows if (r.config if isinstance(r, TableError)
                                  else r.context.config) is None]
    if isinstance(row, TableError):
        return _error(row.message)
    return _outcome(lambda: row)


def _case(policy: Any, q: dict[str, Any]) -> tuple[str, Any]:
    platform, arch = q["target"]
    given: dict[str, Any] = {"architecture": q["architecture"], "platform": platform,
                             "outside_catalog": True, "features": q["features"],
                             "env": q["env"]}
    if arch:
        given["device_arch"] = arch
    if q["vllm"]:
        given["engine"] = {"vllm": q["vllm"]}
    text = json.dumps({"schema_version": 1, "cases": [
        {"name": "one", "given": given, "expect": {"runner": "mrv1"}}]})
    (case,) = parse_tests(text.encode(), "t.tests.yaml").cases
    result = run_case(policy, case, decide=decide_with_release)
    if result.resolution is None:
        return _error(result.error or "")
    return _outcome(lambda: result.resolution)


def _replayed(policy: Any, q: dict[str, Any], explained: tuple[str, Any]) -> tuple[str, Any]:
    """The explained question's record, written and read back, decided again: its stage is
    the caller's to give (`policy impact --vllm`), here the recorded release's."""
    query = Query(architecture=q["architecture"], platform=q["target"][0],
                  device_arch=q["target"][1] or None, features=q["features"], env=q["env"],
                  engine={"vllm": q["vllm"]} if q["vllm"] else {},
                  stage=stage_for({"vllm": q["vllm"]} if q["vllm"] else {}))
    asked = _outcome(lambda: decide_query(policy, query, refused=True))
    assert asked == explained
    if asked[0] == "error":
        return asked  # nothing was decided, so nothing is recorded
    resolution = decide_query(policy, query, refused=True)
    record = json.loads(decision_log.encode(decision_log.build_record(resolution, "explain")))
    return _outcome(lambda: decision_log.replay(policy, record, stage_for(
        record["context"]["engine"])))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=questions(VERSIONS))
def test_every_reader_gives_the_same_decision_and_trace(cli: Any, q: dict[str, Any]) -> None:
    policy = load_policy([POLICY])
    explained = _explained(cli, q)
    assert _tabled(cli, q) == explained
    assert _case(policy, q) == explained
    assert _replayed(policy, q, explained) == explained


@settings(max_examples=40, deadline=None)
@given(q=questions(["0.32.0", "0.33.0", "0.34.0"]))
def test_the_vllm_plugin_decides_as_a_query_for_vllm_and_its_record_replays(
    q: dict[str, Any],
) -> None:
    """The plugin (reachable without vLLM: :func:`plugin_decision`) asks the question for
    vLLM's runners, through the running release's stage; a query for the same, and the
    replay of the plugin's record, answer it alike."""
    policy = load_policy([POLICY])
    platform, arch = q["target"]
    has_triton = q["features"].get("has_triton", True)
    features = {k: v for k, v in q["features"].items() if k != "has_triton"}
    facts = EngineFacts(
        architecture=q["architecture"], platform=platform, device_arch=arch,
        vllm_version=q["vllm"], has_triton=has_triton,
        triton_source="detected by the engine (vllm.triton_utils.HAS_TRITON)",
        static_graphs=True, features=features,
    )
    try:
        made = plugin_decision(facts, policy, q["env"])
    except PluginRefusal:
        return  # what the release cannot run stops the engine: no resolution to compare
    except PolicyError as exc:  # refused, or not servable: the query must say the same
        made = exc
    # The engine's environment, read as the plugin reads it (its origin is in the trace).
    env, sources = process_env(policy, q["env"], "process environment of the vLLM engine")
    query = Query(architecture=q["architecture"], platform=platform, device_arch=arch,
                  features={**features, "has_triton": has_triton}, env=env,
                  engine={"vllm": q["vllm"]}, executed_by="vllm", stage=ReleaseStage(q["vllm"]),
                  sources={**sources, "features.has_triton": facts.triton_source})
    asked = _outcome(lambda: decide_query(policy, query))
    if isinstance(made, PolicyError):
        assert _outcome(lambda: _raise(made)) == asked
        return
    assert _outcome(lambda: made.resolution) == asked
    record = json.loads(decision_log.encode(decision_log.build_record(
        made.resolution, "vllm plugin", capabilities=False)))
    assert _outcome(lambda: decision_log.replay(policy, record, ReleaseStage(q["vllm"]))) == asked
