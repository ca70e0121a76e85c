"""Where a measurement goes: the record file (``--record``, else the cache directory), the
command as the record keeps it, and the progress bar on a terminal."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from interlock.core.errors import InputError


def command_line(words: Sequence[str], args: argparse.Namespace) -> str:
    """The command as a record keeps it: ``policy`` and ``words`` (e.g. ``measure MODEL``),
    then the flags that shape the measurement, rebuilt from the parsed arguments."""
    parts = ["policy", *map(str, words)]
    for name, levels in getattr(args, "vary", ()):
        parts += ["--vary", f"{name}={','.join(levels)}"]
    parts += ["--batch-sizes", ",".join(map(str, args.batch_sizes))]
    if args.prompt is not None:
        parts += ["--prompt", args.prompt]
    else:
        parts += ["--prompt-len", str(args.prompt_len)]
    parts += ["--max-tokens", str(args.max_tokens), "--trials", str(args.trials)]
    parts += ["--warmup", str(args.warmup), "--seed", str(args.seed)]
    parts += ["--dtype", args.dtype, "--load-format", args.load_format]
    if args.threads:
        parts += ["--threads", str(args.threads)]
    for flag in ("platform", "device_arch"):
        if getattr(args, flag, None):
            parts += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    for flag in ("feature", "env", "set"):
        for key, value in getattr(args, flag, ()):
            parts += [f"--{flag}", f"{key}={value}"]
    for path in getattr(args, "policy", None) or ():
        parts += ["--policy", str(path)]
    return shlex.join(parts)


def write_record(record: dict[str, Any], target: str | None) -> Path:
    """Write ``record`` to ``target``, else under the cache directory's ``bench/``."""
    if target is None:
        from interlock.core.disk_cache import refused, safe_cache_dir

        cache = safe_cache_dir()
        if cache is None:
            raise InputError(
                f"no --record FILE given, and the cache directory cannot hold the record "
                f"({refused()}); pass --record FILE"
            )
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        target = str(cache / "measure" / f"{stamp}-{record['model']['architecture']}.json")
    path = Path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        raise InputError(f"--record {target}: cannot write the record: {exc.strerror}") from None
    return path


class _Bar:
    """A tqdm bar on stderr, driven by ``interlock.measure.run``'s ``progress(done, total)``."""

    def __init__(self) -> None:
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="measure", unit="trial", file=_terminal())
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _terminal() -> Any:
    """stderr beneath the command line's escaping writer: the bar is interlock's own text and
    redraws itself with carriage returns, which the writer would show escaped."""
    return getattr(sys.stderr, "stream", sys.stderr)


def progress_bar() -> _Bar | None:
    """A bar only on a terminal (and only where tqdm is installed)."""
    import importlib.util

    if not _terminal().isatty() or importlib.util.find_spec("tqdm") is None:
        return None
    return _Bar()
