"""What ``policy vllm MODEL`` gives vLLM, and what interlock reads to decide for it.

The forms other commands accept, plus the one vLLM users type most:

- a model directory (its ``config.json``), or the ``config.json`` itself: vLLM gets the
  directory;
- a GGUF file, or a named model (``smollm2``, a GGUF file shipped in a Python
  distribution): vLLM serves GGUF files, so it gets the file; interlock reads the
  architecture from its conversion, as ``policy explain --model`` does;
- a Hugging Face id (``zai-org/GLM-5.2``) whose config is in the local Hugging Face cache
  (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``): read there,
  read-only and without the network; vLLM gets the id.

``demo`` has no vLLM form and is refused; anything else is an error saying which forms
there are.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from interlock.core.errors import PolicyError

FORMS = (
    "a local model directory (or its config.json), a GGUF file, a named model (smollm2), "
    "or a cached Hugging Face id (org/name in the local Hugging Face cache)"
)


@dataclass(frozen=True)
class VllmModel:
    #: What ``vllm serve`` gets as its model.
    argument: str
    #: What interlock reads for the context: a directory, a GGUF file or a named model.
    readable: str
    #: How MODEL was read, for the log line (``directory``, ``GGUF file``...).
    form: str


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as ``huggingface_hub`` finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "huggingface" / "hub"


def cached_snapshot(model_id: str) -> Path | None:
    """The cached snapshot folder holding ``model_id``'s config.json (the revision
    ``refs/main`` names, else the only snapshot), or None when it is not cached."""
    repo = hub_cache() / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        try:
            revision = ref.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            revision = ""
        if re.fullmatch(r"[0-9a-f]{40}", revision) and (snapshots / revision).is_dir():
            folder = snapshots / revision
            return folder if (folder / "config.json").is_file() else None
    try:
        folders = [p for p in snapshots.iterdir() if (p / "config.json").is_file()]
    except OSError:
        return None
    return folders[0] if len(folders) == 1 else None


def vllm_model(model: str) -> VllmModel:
    """Read MODEL (see the module docstring); raises :class:`PolicyError` naming the forms."""
    from interlock.runners.model.sources import DEMO, HF_ID, NAMED_MODELS, named_file

    if model == DEMO:
        raise PolicyError(
            "the demo model is interlock's own and vLLM cannot serve it; give " + FORMS
        )
    if model in NAMED_MODELS and not Path(model).exists():
        from interlock.runners.model.source_error import ModelSourceError

        try:
            path = named_file(model)
        except ModelSourceError as exc:
            raise PolicyError(str(exc)) from None
        return VllmModel(str(path), model, f"named model ({path.name})")
    path = Path(model)
    if path.suffix.lower() == ".gguf" and path.is_file():
        return VllmModel(model, model, "GGUF file")
    if path.name == "config.json" and path.is_file():
        # "./" keeps a relative folder a path to vLLM (not a hub id, never a flag).
        folder = str(path.parent) if path.parent.is_absolute() else os.path.join(".", path.parent)
        return VllmModel(folder, folder, "directory of config.json")
    if path.is_dir():
        return VllmModel(model, model, "directory")
    if not path.exists() and HF_ID.fullmatch(model):
        snapshot = cached_snapshot(model)
        if snapshot is not None:
            return VllmModel(model, str(snapshot), f"Hugging Face id, cached at {snapshot}")
        raise PolicyError(
            f"{model}: not a local path, and not in the local Hugging Face cache "
            f"({hub_cache()}); interlock reads only cached configs (no network): download it "
            f"first (e.g. `huggingface-cli download {model} config.json`), or give " + FORMS
        )
    what = "does not exist" if not path.exists() else "is not a directory, config.json or GGUF file"
    raise PolicyError(f"{model}: {what}; MODEL is {FORMS}")
