"""8 processes run `policy explain` at once on an empty cache directory, 20 rounds: every run
succeeds, and every entry left in the cache is whole (its digest checks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from interlock.core import disk_cache
from interlock.policy import load_policy, make_context, resolve

PROCESSES = 8
ROUNDS = int(os.environ.get("INTERLOCK_CONCURRENCY_ROUNDS", "20"))
ARGV = ["explain", "GlmMoeDsaForCausalLM", "--platform", "rocm", "--gfx", "gfx950", "--json"]


@pytest.mark.slow
def test_concurrent_cold_explains_share_one_cache(tmp_path: Path, monkeypatch) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("INTERLOCK_NO_PLUGIN_CACHE", None)
    context = make_context("GlmMoeDsaForCausalLM", platform="rocm", device_arch="gfx950")
    expected = resolve(load_policy(use_cache=False), context).decision
    for round_ in range(ROUNDS):
        cache = tmp_path / f"cache{round_}"
        env["INTERLOCK_CACHE_DIR"] = str(cache)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "interlock.cli", *ARGV],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(PROCESSES)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        for proc, (out, err) in zip(procs, outs, strict=True):
            assert proc.returncode == 0, err
            decision = json.loads(out)["decision"]
            assert (decision["runner"], decision["cudagraph"], decision["breakable"]) == (
                expected.runner,
                expected.cudagraph,
                expected.breakable,
            )
        entries = sorted(cache.glob("*.entry"))
        assert {e.name.split("-")[0] for e in entries} == {"policy", "plugins"}
        assert not list(cache.glob(".*.tmp"))  # no temporary file left behind
        monkeypatch.setenv("INTERLOCK_CACHE_DIR", str(cache))
        for entry in entries:
            kind, key = entry.name.removesuffix(".entry").split("-", 1)
            assert disk_cache.read_json(kind, key) is not None, entry
