"""The JSON Schemas kept in schemas/ are current, and the shipped YAML files point at them."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from checkout import HISTORY, REPO

from interlock.cli import main
from interlock.policy.jsonschema import SCHEMA_FILES, json_schema, render

SHIPPED_YAML = {
    REPO / "policies.yaml": "policy",
    REPO / "policies.tests.yaml": "tests",
    **{
        path: "tests" if path.name.endswith(".tests.yaml") else "policy"
        for path in sorted(HISTORY.glob("*.yaml"))
    },
    REPO / "examples" / "sglang.yaml": "policy",
}
MODELINE = "# yaml-language-server: $schema="


@pytest.mark.parametrize("kind", list(SCHEMA_FILES))
def test_the_repository_schemas_are_current(kind: str) -> None:
    name, _ = SCHEMA_FILES[kind]
    assert (REPO / "schemas" / name).read_text() == render(kind), (
        f"schemas/{name} is stale: run `policy schema {kind} > schemas/{name}`"
    )


@pytest.mark.parametrize("path", list(SHIPPED_YAML), ids=lambda p: p.name)
def test_shipped_yaml_starts_with_its_schema_and_validates(path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith(MODELINE)
    schema_path = (path.parent / first[len(MODELINE) :]).resolve()
    assert schema_path == REPO / "schemas" / SCHEMA_FILES[SHIPPED_YAML[path]][0]
    schema = json.loads(schema_path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_the_policy_schema_refuses_what_the_loader_refuses() -> None:
    schema = json_schema("policy")
    policy = yaml.safe_load((REPO / "policies.yaml").read_text())
    policy["rules"][0]["set"] = {"cudagraph": "fulll"}
    with pytest.raises(jsonschema.ValidationError, match="'fulll' is not one of"):
        jsonschema.validate(policy, schema)
    policy["rules"][0]["set"] = {"runner": "mrv1"}
    policy["rules"][0]["whenn"] = {}
    with pytest.raises(jsonschema.ValidationError, match="'whenn' was unexpected"):
        jsonschema.validate(policy, schema)


def test_the_policy_schema_takes_each_engines_fields_by_the_version_prefix() -> None:
    # As the loader: an sglang-X version is SGLang's vocabulary, any other vLLM's.
    schema = json_schema("policy")
    sglang = yaml.safe_load((REPO / "examples" / "sglang.yaml").read_text())
    jsonschema.validate(sglang, schema)
    sglang["defaults"]["runner"] = "mrv2"
    with pytest.raises(jsonschema.ValidationError, match="'runner' was unexpected"):
        jsonschema.validate(sglang, schema)
    vllm = yaml.safe_load((REPO / "policies.yaml").read_text())
    vllm["defaults"]["decode_cuda_graph"] = "full"
    with pytest.raises(jsonschema.ValidationError, match="'decode_cuda_graph' was unexpected"):
        jsonschema.validate(vllm, schema)


def test_shipped_evidence_validates_against_its_schema() -> None:
    schema = json_schema("evidence")
    jsonschema.Draft202012Validator.check_schema(schema)
    records = sorted((REPO / "evidence").glob("*.json"))
    assert records
    for path in records:
        jsonschema.validate(json.loads(path.read_text()), schema)


def test_schema_command(capsys) -> None:
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "interlock policy file"
    assert main(["schema", "tests"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "interlock policy tests file"
    assert main(["schema", "table"]) == 2
