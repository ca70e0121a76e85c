"""A model's own sampling defaults, as vLLM's server reads them (``--generation-config
auto``): the sampling fields of the model directory's ``generation_config.json``, else of a
GGUF file's ``general.sampling.*`` metadata, else those its named-model entry records
(``runners.model.sources.NAMED_MODELS``: a GGUF that carries none). A request's own fields
win over them; ``max_new_tokens`` is vLLM's ``max_tokens``.

The files are untrusted: read with a size bound, each value checked as ``SamplingParams``
checks it, a bad one a ``ModelError`` naming the file and the field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from interlock.core.errors import InputError, ModelError
from interlock.core.files import FileProblem, read_json
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.model.sources import DEMO, NAMED_MODELS, named_file

#: generation_config.json is a few hundred bytes; anything near this is not one.
MAX_GENERATION_CONFIG_BYTES = 1 << 20
#: The generation-config fields vLLM's server takes as sampling defaults, by its names
#: (``max_new_tokens`` becomes ``max_tokens``).
FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature",
          "top_k", "top_p", "min_p", "max_new_tokens")
#: llama.cpp's GGUF keys for the same defaults.
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
    "general.sampling.penalty_present": "presence_penalty",
    "general.sampling.penalty_freq": "frequency_penalty",
}


def generation_defaults(model: str | os.PathLike[str], directory: Path | None
                        ) -> tuple[dict[str, Any], str | None]:
    """The sampling defaults of ``model`` (as ``LLM`` takes it; ``directory``: the model
    directory it resolved to), and where they come from (None: it has none)."""
    name = os.fspath(model)
    if name == DEMO or directory is None:
        return {}, None
    path = directory / "generation_config.json"
    if os.path.lexists(path):
        try:
            config = read_json(path, MAX_GENERATION_CONFIG_BYTES)
        except FileProblem as exc:
            raise ModelError(f"cannot read the generation config: {exc}") from None
        if not isinstance(config, dict):
            raise ModelError(f"{path}: expected a JSON object")
        found = {k: config[k] for k in FIELDS if config.get(k) is not None}
        source = "generation_config.json"
    else:
        gguf = named_file(name) if name in NAMED_MODELS else Path(name)
        found = _gguf_defaults(gguf) if gguf.suffix.lower() == ".gguf" else {}
        source = f"{gguf.name} metadata"
        if not found and name in NAMED_MODELS and NAMED_MODELS[name].sampling:
            found = dict(NAMED_MODELS[name].sampling)
            source = f"the {name} entry ({NAMED_MODELS[name].sampling_source})"
    if "max_new_tokens" in found:
        found["max_tokens"] = found.pop("max_new_tokens")
    if not found:
        return {}, None
    try:
        SamplingParams(**found)
    except InputError as exc:
        raise ModelError(f"{source}: a sampling default is invalid: {exc}") from None
    return found, source


def _gguf_defaults(path: Path) -> dict[str, Any]:
    from interlock.runners.model.gguf.reader import Fields, open_reader

    fields = Fields(open_reader(path), path)
    found: dict[str, Any] = {}
    for key, name in GGUF_KEYS.items():
        value = fields.get(key)
        if value is not None:
            found[name] = value
    return found
