"""SGLang's own resolution of ONE context with interlock's plugin loaded, as SGLang's engine
loads it (``load_plugins()``, then ``ServerArgs(...).resolve_once()``), under the probe's
stand-in platform. Runs inside the .sglang venv (``make sglang`` installs interlock there,
entry point included); ``make test-sglang`` runs it in fresh processes.

Prints one JSON object: the decision fields read back with ``resolution_result`` (as
probe.py reads them), and for each the source string of the step that declared it last.

Usage: governed.py --platform rocm --device-arch gfx950 [--attention mla] [--set K=V]... ARCH
       (``--set cuda_graph_backend_prefill=breakable``: a ServerArgs keyword, as a user gives it)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe  # noqa: E402
import standins  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="cpu", choices=("cuda", "rocm", "cpu"))
    parser.add_argument("--device-arch", default="")
    parser.add_argument("--attention", help="the catalog's attention kind (mla, dsa)")
    parser.add_argument("--set", action="append", default=[], metavar="K=V",
                        help="a ServerArgs keyword the user gives (JSON value, else text)")
    parser.add_argument("architecture")
    args = parser.parse_args(argv)
    standins.install(args.platform, args.device_arch)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()
    given = {}
    for item in args.set:
        key, _, text = item.partition("=")
        try:
            given[key] = json.loads(text)
        except json.JSONDecodeError:
            given[key] = text
    config = probe.stand_in_config(args.architecture, args.attention)
    with tempfile.TemporaryDirectory(prefix="sglang-governed-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        server_args = ServerArgs(
            model_path=folder, device="cpu" if args.platform == "cpu" else None, **given
        )
        server_args.resolve_once()
    decision, _ = probe.read_decision(server_args)
    last: dict[str, str] = {}
    for source, declared in server_args._resolved_overrides:
        for name in declared:
            last[name] = source
    sources = {f: last.get(probe.SERVER_ARGS_FIELD[f], "default") for f in probe.FIELDS}
    print(json.dumps({"decision": decision, "sources": sources}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
