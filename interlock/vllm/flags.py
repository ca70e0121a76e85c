"""What a ``vllm serve`` command line says that the policy decides on, read as vLLM reads it.

Two kinds of flag matter to a resolution:

- **features**: the deployment facts rules match on (``--tensor-parallel-size 8`` is
  ``tensor_parallel_size=8``), each a given fact whose source names the flag
  (``vllm flag --tensor-parallel-size``), so provenance and ``policy explain`` show it;
- **decision fields** the user set: ``-cc.cudagraph_mode``, ``-cc.mode`` (also as
  ``--compilation-config`` keys or JSON, where ``null`` means "not given", as in vLLM),
  ``--enforce-eager`` and the optimization level ``-O0``..``-O3``.

vLLM's levels set defaults for what is still unset (``vllm/config/vllm.py``): cudagraph
mode NONE at O0, PIECEWISE at O1, FULL_AND_PIECEWISE at O2 and O3; compilation off at O0
and VLLM_COMPILE above. An explicit ``-cc`` key beats the level. So a level replaces the
policy's defaults for those fields (the release's engine stage, :mod:`interlock.vllm.stage`,
reads the level as the ``optimization_level`` feature), and a rule that decides otherwise is
an error naming both, since the ``-cc`` flag interlock adds would contradict the level
silently.

Everything else passes through unread. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from interlock.core.cudagraph import CUDAGRAPH_MODES
from interlock.core.errors import PolicyError
from interlock.vllm.releases import LEVELS

#: The source a feature read from a flag gets in the context (shown in provenance).
FLAG_SOURCE = "vllm flag {}"
#: vLLM's CompilationMode names (and numbers) interlock's ``compile`` field can say.
COMPILE_MODES = {"NONE": False, "0": False, "VLLM_COMPILE": True, "3": True}
CC = ("-cc", "--compilation-config", "--compilation_config")
OPTIMIZATION = ("-O", "--optimization-level", "--optimization_level")


@dataclass(frozen=True)
class IntFlag:
    """A ``vllm serve`` flag whose value is a policy feature that is a positive integer."""

    feature: str
    names: tuple[str, ...]


#: Flags taking a value that are features; the first name is how interlock writes it.
INT_FLAGS = (
    IntFlag("tensor_parallel_size", ("--tensor-parallel-size", "--tensor_parallel_size", "-tp")),
    IntFlag(
        "pipeline_parallel_size", ("--pipeline-parallel-size", "--pipeline_parallel_size", "-pp")
    ),
    IntFlag("data_parallel_size", ("--data-parallel-size", "--data_parallel_size", "-dp")),
    IntFlag("max_num_seqs", ("--max-num-seqs", "--max_num_seqs")),
)
QUANTIZATION = ("--quantization", "-q")
SPECULATIVE = ("--speculative-config", "--speculative_config")
ENFORCE_EAGER = ("--enforce-eager", "--enforce_eager")
#: Feature -> the flag interlock writes for it when it was given only with ``--feature``.
FEATURE_FLAGS = {
    **{f.feature: f.names[0] for f in INT_FLAGS},
    "quantization": QUANTIZATION[0],
    "enforce_eager": ENFORCE_EAGER[0],
    "optimization_level": "-O",
}


@dataclass(frozen=True)
class UserFlags:
    """What the user's ``vllm serve`` arguments say to the policy."""

    #: Decision fields the user set, as policy overrides.
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Decision field -> the flag that set it, for messages.
    given_by: dict[str, str] = field(default_factory=dict)
    #: Features read from flags, and the flag each came from.
    features: dict[str, Any] = field(default_factory=dict)
    feature_flags: dict[str, str] = field(default_factory=dict)
    #: The optimization level and the flag as written (``-O0``), or None.
    level: int | None = None
    level_flag: str = ""
    #: The model's task given with ``--runner`` (vLLM's runner type), None for ``auto``.
    task: str | None = None

    @property
    def pooling(self) -> bool:
        return self.task == "pooling"

    def sources(self) -> dict[str, str]:
        """Context sources of the features: ``features.K`` -> ``vllm flag --flag``."""
        return {
            f"features.{key}": FLAG_SOURCE.format(flag)
            for key, flag in self.feature_flags.items()
        }


def _takes_value(name: str) -> bool:
    if name in CC or name in OPTIMIZATION or name in QUANTIZATION or name in SPECULATIVE:
        return True
    if name == "--runner" or any(name in f.names for f in INT_FLAGS):
        return True
    return any(name == f"{cc}.{k}" for cc in CC for k in ("mode", "cudagraph_mode"))


def read_user_flags(args: Sequence[str]) -> UserFlags:
    """Read ``vllm serve`` arguments (see the module docstring); a malformed value of a flag
    read here is a :class:`PolicyError` naming the flag."""
    flags = _Reader()
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        name, eq, value = arg.partition("=")
        if name.startswith("-O") and len(name) > 2 and not name.startswith("--"):
            name, eq, value = "-O", "=", name[2:]  # -O3, as vLLM writes it
        if _takes_value(name) and not eq:
            if i + 1 >= len(items):
                raise PolicyError(f"vllm serve argument {arg} needs a value")
            value = items[i + 1]
            i += 1
        i += 1
        flags.read(arg, name, value)
    return flags.done()


class _Reader:
    def __init__(self) -> None:
        self.overrides: dict[str, Any] = {}
        self.given_by: dict[str, str] = {}
        self.features: dict[str, Any] = {}
        self.feature_flags: dict[str, str] = {}
        self.level: int | None = None
        self.level_flag = ""
        self.task: str | None = None

    def read(self, arg: str, name: str, value: str) -> None:
        shown = f"{name} {value}" if _takes_value(name) else arg
        int_flag = next((f for f in INT_FLAGS if name in f.names), None)
        if name in CC:
            data = _json_object(name, value)
            for key in ("mode", "cudagraph_mode"):
                if data.get(key) is not None:  # null: not given, as vLLM reads it
                    self._set(key, str(data[key]), shown)
        elif name.split(".")[0] in CC and name.endswith((".mode", ".cudagraph_mode")):
            self._set(name.rsplit(".", 1)[1], value, shown)
        elif name in OPTIMIZATION:
            self._level(value, arg if name == "-O" and arg.startswith("-O") else shown)
        elif name in ENFORCE_EAGER:
            # vLLM: "equivalent to -cc.mode=none -cc.cudagraph_mode=none".
            self.overrides.update(cudagraph="none", compile=False)
            self.given_by.update(cudagraph=arg, compile=arg)
            self._feature("enforce_eager", True, name)
        elif int_flag is not None:
            self._feature(int_flag.feature, _positive(name, value), name)
        elif name in QUANTIZATION:
            if not value or value.startswith("-"):
                raise PolicyError(f"{name}: expected a quantization method, e.g. fp8")
            self._feature("quantization", value, name)
        elif name in SPECULATIVE:
            self._feature("speculative", _speculative(name, value), name)
        elif name == "--runner":
            self.task = _task(name, value)

    def _feature(self, key: str, value: Any, flag: str) -> None:
        if key in self.features and self.features[key] != value:
            raise PolicyError(
                f"{flag} {value} contradicts {self.feature_flags[key]} {self.features[key]} "
                "given before it"
            )
        self.features[key] = value
        self.feature_flags[key] = flag

    def _level(self, value: str, shown: str) -> None:
        try:
            level = int(value)
        except ValueError:
            level = -1
        if level not in LEVELS:
            raise PolicyError(
                f"{shown}: vLLM's optimization levels are 0, 1, 2 and 3, not {value!r}"
            )
        self.level, self.level_flag = level, shown
        self._feature("optimization_level", level, shown.split(" ")[0].rstrip("0123"))

    def _set(self, key: str, value: str, shown: str) -> None:
        if key == "mode":
            if value.upper() not in COMPILE_MODES:
                raise PolicyError(
                    f"{shown}: interlock's policy speaks of compilation mode VLLM_COMPILE "
                    f"(compile: true) or NONE (compile: false), not {value!r}"
                )
            self.overrides["compile"] = COMPILE_MODES[value.upper()]
            self.given_by["compile"] = shown
        else:
            mode = value.lower()
            if mode not in CUDAGRAPH_MODES:
                raise PolicyError(
                    f"{shown}: unknown cudagraph mode {value!r}; allowed: "
                    + ", ".join(m.upper() for m in CUDAGRAPH_MODES)
                )
            self.overrides["cudagraph"] = mode
            self.given_by["cudagraph"] = shown

    def done(self) -> UserFlags:
        return UserFlags(
            self.overrides, self.given_by, self.features, self.feature_flags, self.level,
            self.level_flag, self.task,
        )


#: The model tasks ``vllm serve --runner`` names (vLLM's RunnerOption); ``auto`` leaves the
#: task to the model. Not a decision's runner: vLLM spells the task with that flag.
VLLM_TASKS = ("generate", "pooling", "draft")


def _task(flag: str, value: str) -> str | None:
    if value == "auto":
        return None
    if value not in VLLM_TASKS:
        raise PolicyError(
            f"{flag} {value}: vLLM's model tasks are auto, {', '.join(VLLM_TASKS)}"
        )
    return value


def _json_object(name: str, value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        raise PolicyError(f"{name}: not a JSON object: {value!r}") from None
    if not isinstance(data, dict):
        raise PolicyError(f"{name}: not a JSON object: {value!r}")
    return data


def _positive(name: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1 or not value.strip().isdigit():
        raise PolicyError(f"{name}: expected a positive integer, got {value!r}")
    return number


def _speculative(name: str, value: str) -> str:
    """The ``speculative`` feature of a speculative config: its method, else
    ``draft_model`` when it names a draft model."""
    data = _json_object(name, value)
    method = data.get("method")
    if isinstance(method, str) and method:
        return method
    if data.get("model") is not None:
        return "draft_model"
    raise PolicyError(f"{name}: the speculative config names neither a method nor a model")


def flags_for_features(features: dict[str, Any], user: UserFlags) -> list[str]:
    """The ``vllm serve`` flags that make vLLM run the features given with ``--feature`` but
    not on its command line, so that vLLM runs what was decided. A feature vLLM cannot be
    given that way is an error."""
    flags: list[str] = []
    for key, value in features.items():
        if key in user.features:
            if user.features[key] != value:
                raise PolicyError(
                    f"--feature {key}={value} contradicts the vllm serve flag "
                    f"{user.feature_flags[key]} {user.features[key]}"
                )
            continue
        if key == "speculative":
            raise PolicyError(
                f"--feature speculative={value}: vLLM takes speculative decoding as "
                "--speculative-config JSON; give that after MODEL instead"
            )
        flag = FEATURE_FLAGS.get(key)
        if flag is None:
            continue  # a fact for the policy only (has_triton, lora…): nothing for vLLM
        if key == "enforce_eager":
            if value is True:
                flags.append(flag)
        elif key == "optimization_level":
            flags.append(f"-O{value}")
        else:
            flags += [flag, str(value)]
    return flags
