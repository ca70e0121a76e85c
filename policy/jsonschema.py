"""JSON Schemas of the policy file, the policy tests file and the measurement evidence record,
generated from their models.

Editors use them through the first line of a YAML file
(``# yaml-language-server: $schema=schemas/policy.schema.json``); the copies in
``schemas/`` are regenerated with ``policy schema KIND > schemas/FILE`` and a
test keeps them current.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: Kind -> (file name in schemas/, title).
SCHEMA_FILES = {
    "policy": ("policy.schema.json", "interlock policy file"),
    "tests": ("policy-tests.schema.json", "interlock policy tests file"),
    "evidence": ("evidence.schema.json", "interlock measurement evidence record"),
}


def json_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of ``kind`` (``policy``, ``tests`` or ``evidence``)."""
    model: type[BaseModel]
    if kind == "policy":
        return {"$schema": DIALECT, **_policy_schema(), "title": SCHEMA_FILES[kind][1]}
    if kind == "tests":
        from interlock.policy.testfile import TestsFileModel

        model = TestsFileModel
    elif kind == "evidence":
        from interlock.policy.evidence_schema import EvidenceRecordModel

        model = EvidenceRecordModel
    else:
        raise ValueError(f"unknown schema {kind!r}; known: {', '.join(SCHEMA_FILES)}")
    schema = model.model_json_schema()
    return {"$schema": DIALECT, **schema, "title": SCHEMA_FILES[kind][1]}


def _policy_schema() -> dict[str, Any]:
    """Each engine's policy file, chosen as the loader chooses it: by the ``version:`` prefix
    (``sglang-``), and vLLM's where no other engine's prefix matches."""
    from pydantic.json_schema import models_json_schema

    from interlock.core.decision import VLLM, VOCABULARIES
    from interlock.policy.release import PREFIXES
    from interlock.policy.schema import file_model

    others = [v for v in VOCABULARIES.values() if v is not VLLM]
    models = {v.engine: file_model(v) for v in (VLLM, *others)}
    refs, schema = models_json_schema([(m, "validation") for m in models.values()])

    def ref(engine: str) -> dict[str, Any]:
        return refs[(models[engine], "validation")]

    def version(pattern: dict[str, Any]) -> dict[str, Any]:
        return {"properties": {"version": pattern}, "required": ["version"]}

    prefixes = "|".join(PREFIXES[v.engine] for v in others)
    return {
        "type": "object",
        "allOf": [
            *({"if": version({"pattern": f"^{PREFIXES[v.engine]}"}), "then": ref(v.engine)}
              for v in others),
            {"if": version({"not": {"pattern": f"^({prefixes})"}}), "then": ref(VLLM.engine)},
        ],
        **schema,
    }


def render(kind: str) -> str:
    """The schema as the repository keeps it: indented JSON with a final newline."""
    return json.dumps(json_schema(kind), indent=2) + "\n"
