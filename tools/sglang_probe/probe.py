"""Run SGLang's own resolution for many architectures on ONE platform, in one process.

Runs inside the .sglang venv (``make sglang``), never in interlock's: it imports SGLang.
SGLang binds its platform at import (torch's device queries, cached), so a process
serves one (platform, device arch); within it every architecture gets a fresh
``ServerArgs(model_path=DIR).resolve_once()`` on a stand-in checkpoint folder holding
only a ``config.json`` (standins.py fakes the GPU).

The stand-in config is Llama-shaped, with the architecture's name in ``architectures``
(every decision SGLang keys on the name is exact); an architecture the catalogs call
``attention: mla`` or ``dsa`` also gets the MLA keys (``kv_lora_rank``, ...), and ``dsa``
the sparse indexer's (``index_topk``, ...), since SGLang reads those from the config.

Read back per context, each through SGLang's own ``resolution_result`` and with the
step that declared it last (``sources``): the decode and prefill CUDA-graph backends
and their ``max_bs``, ``enable_torch_compile`` and ``attention_backend``. A context
whose resolution raises is recorded as ``outcome: refused`` with SGLang's message.

Usage: probe.py --platform cuda --device-arch sm_90 [--traits TRAITS.json] --out OUT.jsonl|- ARCH...
       probe.py --list-named    (the release's version and the architectures its overrides name)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import standins  # noqa: E402

#: The decision fields read back, each with the ServerArgs field it lives in.
SERVER_ARGS_FIELD = {
    "decode_cuda_graph": "cuda_graph_config",
    "decode_cuda_graph_max_bs": "cuda_graph_config",
    "prefill_cuda_graph": "cuda_graph_config",
    "prefill_cuda_graph_max_bs": "cuda_graph_config",
    "torch_compile": "enable_torch_compile",
    "attention_backend": "attention_backend",
}
FIELDS = tuple(SERVER_ARGS_FIELD)

#: What SGLang raises when it refuses a context (its own checks).
REFUSALS = (ValueError, NotImplementedError, RuntimeError, AssertionError)

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}
MLA = {
    "kv_lora_rank": 64,
    "q_lora_rank": 96,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
}
DSA = {"index_topk": 256, "index_head_dim": 32, "index_n_heads": 4}
#: Keys a family's config has and Llama's lacks, added when SGLang asks for one (an
#: ``AttributeError`` naming it) and the context run again; the row lists them.
ON_DEMAND = {
    **MLA,
    "sliding_window": 1024,
    "sliding_window_pattern": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "local_layer_ids": [0],
    "mtp_local_layer_ids": [],
}
MISSING_KEY = re.compile(r"'\w+Config' object has no attribute '(\w+)'")


def stand_in_config(architecture: str, attention: str | None) -> dict[str, Any]:
    config: dict[str, Any] = {"architectures": [architecture], **LLAMA}
    if attention in ("mla", "dsa"):
        config.update(MLA)
    if attention == "dsa":
        config.update(DSA)
    return config


def read_decision(server_args: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The decision fields of a resolved ``ServerArgs``, and the step that declared each."""
    from sglang.srt.arg_groups.overrides import resolution_result

    graphs = resolution_result(server_args, "cuda_graph_config")
    decision = {
        "decode_cuda_graph": graphs.decode.backend,
        "decode_cuda_graph_max_bs": graphs.decode.max_bs,
        "prefill_cuda_graph": graphs.prefill.backend,
        "prefill_cuda_graph_max_bs": graphs.prefill.max_bs,
        "torch_compile": bool(resolution_result(server_args, "enable_torch_compile")),
        "attention_backend": resolution_result(server_args, "attention_backend"),
    }
    last: dict[str, str] = {}
    for source, declared in server_args._resolved_overrides:
        for name in declared:
            last[name] = source
    sources = {
        field: last.get(SERVER_ARGS_FIELD[field], "default") for field in FIELDS
    }
    return decision, sources


def probe_one(platform: str, architecture: str, attention: str | None) -> dict[str, Any]:
    config = stand_in_config(architecture, attention)
    added: list[str] = []
    while True:
        row = _resolve(platform, architecture, config)
        missing = MISSING_KEY.search(row.get("probe_error", ""))
        if not missing or missing.group(1) not in ON_DEMAND or missing.group(1) in config:
            break
        key = missing.group(1)
        # MLA's keys come together: SGLang reads them as one shape.
        for name in MLA if key in MLA else (key,):
            config[name] = ON_DEMAND[name]
            added.append(name)
    if added:
        row["stand_in_keys"] = added
    return row


def _resolve(platform: str, architecture: str, config: dict[str, Any]) -> dict[str, Any]:
    from sglang.srt.server_args import ServerArgs

    row: dict[str, Any] = {"architecture": architecture}
    with tempfile.TemporaryDirectory(prefix="sglang-probe-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        server_args = ServerArgs(
            model_path=folder, device="cpu" if platform == "cpu" else None
        )
        try:
            server_args.resolve_once()
        except Exception as exc:
            message = str(exc).strip().splitlines()
            said = f"{type(exc).__name__}: {message[0] if message else ''}"
            step = traceback.extract_tb(exc.__traceback__)[-1]
            if isinstance(exc, REFUSALS) and "/sglang/" in step.filename:
                # SGLang refusing the context (a check of its own) is an outcome.
                row.update(outcome="refused", refusal=said, where=step.name)
            else:
                # Anything else is the stand-in falling short (a config key the
                # stand-in lacks, a CUDA call on CPU torch): never compared.
                row.update(outcome="probe_error", probe_error=f"{said} (in {step.name})")
            return row
    decision, sources = read_decision(server_args)
    row.update(outcome="decided", **decision, sources=sources)
    return row


def list_named() -> dict[str, Any]:
    """SGLang's version and every architecture its per-model overrides are keyed on."""
    import sglang
    from sglang.srt.arg_groups import model_override_base, overrides  # noqa: F401 (registers)

    named = set(model_override_base.MODEL_OVERRIDES) | set(model_override_base._MODEL_OVERRIDE_FNS)
    return {"sglang": sglang.__version__, "named": sorted(named)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="cpu", choices=("cuda", "rocm", "cpu"))
    parser.add_argument("--list-named", action="store_true")
    parser.add_argument("--device-arch", default="")
    parser.add_argument("--traits", type=Path, help="JSON: architecture -> attention kind")
    parser.add_argument("--out", type=Path)
    parser.add_argument("architectures", nargs="*")
    args = parser.parse_args(argv)
    attention = json.loads(args.traits.read_text()) if args.traits else {}
    standins.install(args.platform, args.device_arch)
    if args.list_named:
        print(json.dumps(list_named()))
        return 0
    if args.out is None:
        parser.error("--out is required")
    import logging

    logging.disable(logging.WARNING)
    with contextlib.ExitStack() as stack:
        out = sys.stdout if str(args.out) == "-" else stack.enter_context(args.out.open("a"))
        for architecture in args.architectures:
            row = probe_one(args.platform, architecture, attention.get(architecture))
            row.update(platform=args.platform, device_arch=args.device_arch)
            out.write(json.dumps(row, sort_keys=True) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
