"""SGLang's own resolution under the probe's stand-in platforms (tools/sglang_probe/), in
`.sglang/` (`make sglang`). Opt in: `make test-sglang` (marker ``sglang``; the default run
leaves these out).

The committed snapshot, conformance/sglang-0.5.23.jsonl, is what SGLang decides: the seed
contexts, re-run in fresh probe processes, must give its rows exactly. docs/sglang.md's
``console`` blocks run as shown and print what it shows.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".sglang" / "bin" / "python"
PROBE = ROOT / "tools" / "sglang_probe" / "probe.py"
SNAPSHOT = ROOT / "conformance" / "sglang-0.5.23.jsonl"
PAGE = ROOT / "docs" / "sglang.md"

#: The seeds' families, each where its incident was (and DeepSeek-V3 on B200, where a step
#: after the CUDA-graph step turns prefill graphs off).
SEEDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("rocm", "gfx950"): ("GlmMoeDsaForCausalLM", "KimiK3ForConditionalGeneration"),
    ("rocm", "gfx942"): ("HYV4ForCausalLM",),
    ("cuda", "sm_90"): ("DeepseekV32ForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
    ("cuda", "sm_100"): ("DeepseekV3ForCausalLM",),
    ("cpu", ""): ("LlamaForCausalLM",),
}


def _snapshot() -> dict[tuple[str, str, str], dict[str, Any]]:
    rows = [json.loads(line) for line in SNAPSHOT.read_text().splitlines()[1:]]
    return {(r["architecture"], r["platform"], r["device_arch"]): r for r in rows}


@pytest.fixture(scope="module")
def traits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The catalogs' attention kinds, as the snapshot handed them to the probe."""
    spec = importlib.util.spec_from_file_location("sglang_snapshot", PROBE.parent / "snapshot.py")
    assert spec is not None and spec.loader is not None
    snapshot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snapshot)
    attention = snapshot.catalog_attention([ROOT / p for p in snapshot.DEFAULT_POLICIES])
    path = tmp_path_factory.mktemp("traits") / "traits.json"
    path.write_text(json.dumps({a: k for a, k in attention.items() if k}))
    return path


@pytest.mark.parametrize(("platform", "device_arch"), list(SEEDS))
def test_snapshot_is_what_sglang_decides(
    platform: str, device_arch: str, traits: Path, tmp_path: Path
) -> None:
    if not PYTHON.exists():
        pytest.fail("no .sglang venv: run make sglang")
    out = tmp_path / "rows.jsonl"
    proc = subprocess.run(
        [str(PYTHON), str(PROBE), "--platform", platform, "--device-arch", device_arch,
         "--traits", str(traits), "--out", str(out), *SEEDS[(platform, device_arch)]],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    snapshot = _snapshot()
    for line in out.read_text().splitlines():
        row = json.loads(line)
        key = (row["architecture"], platform, device_arch)
        expected = {k: v for k, v in snapshot[key].items() if k != "sglang"}
        assert row == expected, key
        assert row["outcome"] == "decided", row


def _console_blocks() -> list[tuple[str, list[str]]]:
    out = []
    for block in re.findall(r"```console\n(.*?)```", PAGE.read_text(), flags=re.S):
        command, *lines = block.rstrip("\n").split("\n")
        out.append((command.removeprefix("$ "), lines))
    return out


@pytest.mark.parametrize(("command", "shown"), _console_blocks(), ids=lambda v: str(v)[:60])
def test_the_page_prints_what_it_shows(command: str, shown: list[str]) -> None:
    if not PYTHON.exists():
        pytest.fail("no .sglang venv: run make sglang")
    proc = subprocess.run(
        command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.rstrip("\n").split("\n") == shown


def test_the_shipped_policy_has_the_refs_and_catalog_sglang_gives(tmp_path: Path) -> None:
    """examples/sglang.yaml is what tools/sglang_probe/annotate.py writes from the installed
    SGLang (make sglang-annotate), and the page counts its catalog right."""
    if not PYTHON.exists():
        pytest.fail("no .sglang venv: run make sglang")
    policy = ROOT / "examples" / "sglang.yaml"
    proc = subprocess.run(
        [str(PYTHON), str(PROBE.parent / "annotate.py"), "--check"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # --check compares what a run writes: a run on a copy leaves it byte for byte.
    copy = tmp_path / "sglang.yaml"
    copy.write_bytes(policy.read_bytes())
    proc = subprocess.run(
        [str(PYTHON), str(PROBE.parent / "annotate.py"), "--policy", str(copy)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert copy.read_bytes() == policy.read_bytes()
    catalog = yaml.safe_load(policy.read_text())["catalog"]
    assert f"{len(catalog)} architectures SGLang 0.5.23's model registry" in PAGE.read_text()
