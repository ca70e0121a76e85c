"""Decision records and their readers, third hostile pass (issue 38): items 1, 4 and 8, and
the decision log's symbolic link."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from policy_texts import MINIMAL_BASE, with_rules

from interlock import decision_log
from interlock.policy.context import make_context
from interlock.policy.loader import load_policy
from interlock.policy.resolution import resolve

#: A rule on each fact a record must carry for a replay: model identity, engine version and a
#: config value, each changing one field of the deployment below.
NEW_RULES = """\
  - id: by-model
    when: {architecture: DenseModel, model: "acme-7b*"}
    set: {runner: mrv1}
    reason: the acme checkpoints run on MRV1 until their loader is ported
  - id: by-engine
    when: {architecture: DenseModel, engine: {vllm: ">=0.33"}}
    set: {cudagraph: piecewise}
    reason: vLLM 0.33 broke full graphs for this family, piecewise until fixed
  - id: by-config
    when: {architecture: DenseModel, config: {"quantization_config.quant_method": fp8}}
    set: {breakable: true}
    reason: fp8 checkpoints need breakable graphs around their scaling kernels
  - id: by-config-nested
    when: {architecture: DenseModel, config: {"rope_scaling": {eq: 1}}}
    set: {compile: false}
    reason: an object-valued config key never equals a scalar, so this rule never matches
  - id: by-config-2
    when: {architecture: DenseModel, config: {"num_hidden_layers": {gt: 2}}}
    set: {compile: false}
    reason: deep checkpoints compile too slowly for the rollout window we have
"""


@pytest.fixture
def policies(tmp_path: Path) -> tuple[Path, Path]:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(with_rules(base=MINIMAL_BASE))
    new.write_text(with_rules(NEW_RULES, base=MINIMAL_BASE))
    return old, new


def _record(tmp_path: Path, old: Path) -> dict[str, Any]:
    model = tmp_path / "acme-7b-fp8"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["DenseModel"], "num_hidden_layers": 4,
        "quantization_config": {"quant_method": "fp8"}, "rope_scaling": {"type": "yarn"},
    }))
    context = make_context(platform="cpu", model=model, engine={"vllm": "0.33.0"},
                           features={"has_triton": True})
    return decision_log.build_record(resolve(load_policy([str(old)]), context), "policy run",
                                     model=str(model), capabilities=False)


def test_1_a_replay_reads_model_engine_and_config(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path]
) -> None:
    old, new = policies
    log = tmp_path / "log.jsonl"
    decision_log.append_record(log, _record(tmp_path, old))
    result = cli("impact", "--log", log, old, new, "--json", "--fail-on-change")
    assert result.code == 1, result.err
    document = result.json()
    (change,) = document["changed"]
    assert {f["field"]: (f["old"], f["new"]) for f in change["fields"]} == {
        "runner": ("mrv2", "mrv1"), "cudagraph": ("full_and_piecewise", "piecewise"),
        "breakable": (False, True), "compile": (True, False),
    }
    assert document["cannot_tell"] == []


@pytest.mark.parametrize("lacks", ["config_values", "model", "engine"])
def test_1_a_record_without_a_fact_the_rules_read_is_cannot_tell(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path], lacks: str
) -> None:
    old, new = policies
    record = _record(tmp_path, old)
    del record["context"][lacks]  # a record written before the fact was kept
    log = tmp_path / "log.jsonl"
    decision_log.append_record(log, record)
    result = cli("impact", "--log", log, old, new, "--fail-on-change")
    assert result.code == 1, result.out
    assert "0 of 1 recorded deployment(s) would change, 1 cannot tell" in result.out
    assert "CANNOT TELL" in result.out
    reads = {"config_values": "config", "model": "model", "engine": "engine"}[lacks]
    assert f"reads {reads}, which the record does not carry" in result.out


def test_1_an_unrelated_rule_does_not_make_it_unknowable(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path]
) -> None:
    """A rule reading a missing fact whose other conditions fail for the record is no doubt."""
    old, new = policies
    record = _record(tmp_path, old)
    del record["context"]["config_values"]
    record["context"]["architecture"] = "DsaModel"
    log = tmp_path / "log.jsonl"
    decision_log.append_record(log, record)
    result = cli("impact", "--log", log, old, new, "--fail-on-change")
    assert result.code == 0, result.out
    assert "0 of 1 recorded deployment(s) would change (" in result.out


BAD_RECORDS = {
    "decision is a string": {"decision": "mrv1"},
    "context is garbage": {"context": {"architecture": 7, "platform": "cpu"}},
    "features hold a list": {"context": {"architecture": "DenseModel", "platform": "cpu",
                                         "features": {"tp": [1, 2]}}},
    "an override outside its field": {"overrides": {"cudagraph": "sideways"}},
    "engine is a list": {"engine": ["verified"]},
    "host is a number": {"host": 5},
    "problems hold a number": {"engine": {"verified": False, "problems": [1]}},
}


def _good(tmp_path: Path, old: Path) -> dict[str, Any]:
    return _record(tmp_path, old)


def test_4_malformed_records_are_skipped_and_counted(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path]
) -> None:
    old, new = policies
    good = _good(tmp_path, old)
    log = tmp_path / "log.jsonl"
    for damage in BAD_RECORDS.values():
        decision_log.append_record(log, {**good, **damage})
    decision_log.append_record(log, good)
    result = cli("log", log)
    assert result.code == 0, result.err
    assert len(result.out.splitlines()) == 1
    assert result.err.count("(skipped)") == len(BAD_RECORDS)
    assert f"{len(BAD_RECORDS)} line(s) of" in result.err
    assert "Traceback" not in result.err
    impact = cli("impact", "--log", log, old, old, "--json")
    assert impact.code == 0, impact.err
    assert len(impact.json()["skipped"]) == len(BAD_RECORDS)


def test_4_every_field_printed_is_escaped(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path]
) -> None:
    old, _ = policies
    record = _good(tmp_path, old)
    record["command"] = "policy run\n    engine: verified (0.33.0)\nfake"
    record["engine"] = {"verified": True, "vllm_version": "0.33.0\n    engine: verified"}
    record["host"] = "h\x1b[2Jost"
    log = tmp_path / "log.jsonl"
    decision_log.append_record(log, record)
    result = cli("log", log)
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert len(lines) == 2, lines
    assert lines[1].startswith("    engine: verified (0.33.0\\n")
    assert "\x1b" not in result.out


def test_4_a_runner_no_plugin_provides_is_named(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path]
) -> None:
    old, _ = policies
    record = _good(tmp_path, old)
    record["decision"]["runner"] = "ghost"
    log = tmp_path / "log.jsonl"
    decision_log.append_record(log, record)
    result = cli("impact", "--log", log, old, old)
    assert result.code == 0, result.err
    assert "runner 'ghost' is not provided by any installed plugin" in result.err


@pytest.mark.parametrize("since", ["800000d", "99999999999999999999d", "yesterday"])
def test_8_a_since_out_of_range_is_a_usage_error(cli: Any, tmp_path: Path, since: str) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text("")
    result = cli("log", log, "--since", since)
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    assert "--since" in result.err


def test_the_log_does_not_follow_a_symbolic_link(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path]
) -> None:
    old, _ = policies
    target = tmp_path / "bashrc"
    target.write_text("# mine\n")
    link = tmp_path / "log.jsonl"
    os.symlink(target, link)
    with pytest.raises(decision_log.DecisionLogError, match="a symbolic link"):
        decision_log.append_record(link, _good(tmp_path, old))
    assert target.read_text() == "# mine\n"
    result = cli("resolve", "DenseModel", "--policy", old, "--platform", "cpu",
                 "--decision-log", link)
    assert result.code == 1, result.err
    assert target.read_text() == "# mine\n"


#: Values of the wrong kind, put in every field a reader uses (issue 51 item 10: a
#: ``decision.runner`` that is a list made ``policy impact`` exit 70).
WRONG_VALUES = ([1, 2], ["mrv1"], {"a": 1}, 7, 1.5, None, True, "x\ny", "")


def _paths(record: dict[str, Any]) -> list[tuple[str, ...]]:
    """Every top-level field, and every field one level inside an object field."""
    out: list[tuple[str, ...]] = []
    for key, value in record.items():
        out.append((key,))
        if isinstance(value, dict):
            out += [(key, inner) for inner in value]
    return out


def test_51_10_a_field_of_any_wrong_kind_is_named_skipped_and_counted(
    cli: Any, tmp_path: Path, policies: tuple[Path, Path]
) -> None:
    old, new = policies
    good = _good(tmp_path, old)
    good["engine"] = {"verified": True, "vllm_version": "0.33.0", "problems": []}
    good["outcome"] = {"output_tokens": 3, "ttft_ms": 1.0, "tpot_ms": 2.0, "graphs": {}}
    log = tmp_path / "log.jsonl"
    lines = 0
    for path in _paths(good):
        for wrong in WRONG_VALUES:
            record = json.loads(json.dumps(good))
            target = record
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = wrong
            decision_log.append_record(log, record)
            lines += 1
    for command in (("log", log), ("impact", "--log", log, old, new),
                    ("impact", "--log", log, old, new, "--json")):
        result = cli(*command)
        assert result.code == 0, (command, result.err[-3000:])
        assert "Traceback" not in result.err
    skipped = len(cli("impact", "--log", log, old, new, "--json").json()["skipped"])
    shown = len(cli("log", log, "--json").json()["records"])
    assert skipped + shown == lines
    impact = cli("impact", "--log", log, old, new)
    assert f"{skipped} line(s) skipped" in impact.out
    assert "decision: runner: bad value ['mrv1']" in impact.err
