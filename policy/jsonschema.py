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
        from interlock.policy.schema import PolicyFileModel

        model = PolicyFileModel
    elif kind == "tests":
        from interlock.policy.testfile import TestsFileModel

        model = TestsFileModel
    elif kind == "evidence":
        from interlock.policy.evidence_schema import EvidenceRecordModel

        model = EvidenceRecordModel
    else:
        raise ValueError(f"unknown schema {kind!r}; known: {', '.join(SCHEMA_FILES)}")
    schema = model.model_json_schema()
    return {"$schema": DIALECT, **schema, "title": SCHEMA_FILES[kind][1]}


def render(kind: str) -> str:
    """The schema as the repository keeps it: indented JSON with a final newline."""
    return json.dumps(json_schema(kind), indent=2) + "\n"
