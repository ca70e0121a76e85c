"""The layout of a measurement evidence record (``policy measure --record``) as pydantic models:
what ``policy check`` validates a cited record against. Sections the checks do not
read (machine, software, workload, samples) are required but loosely typed."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

RECORD_SCHEMA = "interlock-evidence/1"

_Name = Annotated[str, Field(min_length=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EstimateModel(_Model):
    value: float
    low: float
    high: float
    significant: bool


class EffectModel(EstimateModel):
    factors: Annotated[list[_Name], Field(min_length=1)]
    #: Per factor, its (from, to) levels.
    levels: list[Annotated[list[Any], Field(min_length=2, max_length=2)]]


class FastestModel(_Model):
    config: _Name
    runner_up: str | None
    metric: _Name
    lead: EstimateModel | None = None


class PickComparisonModel(_Model):
    """The policy's pick against the fastest alternative that beats it significantly, else
    the fastest alternative: the pick's metric minus the alternative's."""

    config: _Name
    alternative: _Name
    metric: _Name
    margin: EstimateModel
    beaten: bool


class BatchAnalysisModel(_Model):
    configurations: dict[_Name, dict[_Name, EstimateModel]]
    effects: dict[_Name, list[EffectModel]] | None = None
    fastest: FastestModel | None = None
    pick: PickComparisonModel | None = None


class AnalysisModel(_Model):
    method: str
    confidence: Annotated[float, Field(gt=0, lt=1)]
    resamples: Annotated[int, Field(gt=0)]
    effects_note: str | None
    #: Trials (blocks) per configuration, and the fewest from which a difference is called
    #: significant (absent in records written before that rule).
    trials: Annotated[int, Field(ge=0)] | None = None
    min_trials: Annotated[int, Field(ge=1)] | None = None
    claims: bool | None = None
    batch_sizes: Annotated[dict[_Name, BatchAnalysisModel], Field(min_length=1)]


class ContextModel(_Model):
    architecture: _Name
    platform: _Name
    device_arch: str
    traits: dict[_Name, Any]
    features: dict[_Name, bool | int | float | str]
    env: dict[_Name, str] = {}


class ModelInfo(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: _Name
    architecture: _Name
    config_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class ConfigurationModel(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    id: _Name
    label: str
    levels: dict[_Name, Any]
    decision: dict[_Name, Any]


class DeciderModel(_Model):
    #: ``rule rocm-dsa``, ``defaults``, ``env VAR=1``, ``override``.
    by: _Name
    file: str | None
    line: Annotated[int, Field(ge=1)] | None


class PickModel(_Model):
    """The configuration the policy decides here with no level forced (None: not measured),
    its values of the varied fields, and what decided each."""

    config: str | None
    decision: dict[_Name, Any]
    decided_by: dict[_Name, DeciderModel]


class EvidenceRecordModel(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    schema_: Literal[RECORD_SCHEMA] = Field(alias="schema")  # type: ignore[valid-type]
    created: AwareDatetime
    machine: dict[_Name, Any]
    software: dict[_Name, Any]
    policy: dict[_Name, Any]
    model: ModelInfo
    context: ContextModel
    workload: dict[_Name, Any]
    factors: dict[_Name, Annotated[list[Any], Field(min_length=2)]]
    #: Absent in records written before the pick was recorded, and in `policy diff`'s.
    pick: PickModel | None = None
    configurations: list[ConfigurationModel]
    skipped: list[dict[_Name, Any]]
    samples: Annotated[list[dict[_Name, Any]], Field(min_length=1)]
    analysis: AnalysisModel
