"""Adding a decision field touches the vocabulary and the runner declaration, nothing else.

A copy of the package gets the two blocks the policy reference's "Adding a decision field"
(docs/policy-reference.md) shows (the
field in ``interlock/core/decision.py``, what runners declare of it in
``interlock/plugins/spec.py``); a test plugin declares a runner serving it (the third file: the
runner that acts on it). The rest follows: the policy file's schema, overrides, stage 5's
fallback and errors, the runners' check, ``policy explain`` and ``policy plugins``.
"""

from __future__ import annotations

import re
from pathlib import Path

from checkout import REPO, changed_files, copy_package, python_in

SECTION = "## Adding a decision field"
#: Where each of the README's blocks goes: before or after an anchor of its file.
PLACES = {
    "interlock/core/decision.py": ("before", "\n    def __post_init__(self) -> None:\n"),
    "interlock/plugins/spec.py": ("after", "    compile: bool = False  # torch.compile\n"),
}

PLUGIN = '''
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl

SPEC = RunnerSpec(
    name="fp8kv",
    description="serves an fp8 KV cache (declarations only: never loaded here)",
    plugin_api=">=1.0,<2",
    platforms={"cpu": PlatformSupport(cudagraph={"none"}, kv_cache_dtype={"auto", "fp8"})},
    factory="fp8kv_plugin:SPEC",
)


@hookimpl
def interlock_runner_specs():
    return [SPEC]
'''

POLICY = """\
schema_version: 1
version: t1
catalog:
  DenseLM: {family: d, moe: false, attention: gqa}
defaults: {runner: mrv1, cudagraph: none, breakable: false, compile: false}
rules:
  - id: fp8-kv-cache
    when: {platform: cpu}
    set: {kv_cache_dtype: fp8}
    reason: an fp8 KV cache halves its memory
"""

CHECKS = '''
import io, json, sys
from contextlib import redirect_stdout
from pathlib import Path

from interlock.cli import main
from interlock.core.decision import DECISION_FIELDS, REQUIRED_FIELDS, Decision, parse_field
from interlock.core.errors import PolicyError
from interlock.plugins.capabilities import CapabilityError, capability_stage
from interlock.policy import load_policy_text, make_context, resolve
from interlock.policy.jsonschema import json_schema
from interlock.runners.graphs.runner import RunnerError
from interlock.runners.mrv1.runner import MRV1Runner

policy_text = Path("policy.yaml").read_text()
assert DECISION_FIELDS[-1] == "kv_cache_dtype", DECISION_FIELDS
assert "kv_cache_dtype" not in REQUIRED_FIELDS
assert parse_field("kv_cache_dtype", "fp8") == "fp8"
try:
    Decision(kv_cache_dtype="fp16")
    raise AssertionError("fp16 accepted")
except ValueError as exc:
    assert "kv_cache_dtype: bad value 'fp16'; allowed: auto, fp8" in str(exc), exc

schema = json_schema("policy")["$defs"]["DecisionFields"]["properties"]["kv_cache_dtype"]
assert schema["enum"] == ["auto", "fp8"] and "fp8" in schema["description"], schema
try:
    load_policy_text(policy_text.replace("kv_cache_dtype: fp8", "kv_cache_dtype: fp16"), "p.yaml")
    raise AssertionError("a policy setting fp16 loaded")
except PolicyError as exc:
    assert "p.yaml:" in str(exc) and "'fp8'" in str(exc), exc

policy = load_policy_text(policy_text)
context = make_context("DenseLM", platform="cpu")
stage = capability_stage()
# mrv1 declares nothing of the field: it serves the default only, and the rule's fp8 falls back.
res = resolve(policy, context, capabilities=stage)
assert res.decision.kv_cache_dtype == "auto", res.decision
prov = res.provenance["kv_cache_dtype"]
assert prov.stage == "capabilities" and "kv_cache_dtype=fp8" in prov.reason, prov
assert any(s.name == "kv_cache_dtype fp8 -> auto" for s in res.trace)
# The plugin's runner serves it.
res = resolve(policy, context, {"runner": "fp8kv"}, capabilities=stage)
assert res.decision.kv_cache_dtype == "fp8", res.decision
assert res.to_dict()["decision"]["kv_cache_dtype"] == "fp8"
# Forced on a runner that does not serve it: an error naming who does.
try:
    resolve(policy, context, {"kv_cache_dtype": "fp8"}, capabilities=stage)
    raise AssertionError("forced fp8 on mrv1 resolved")
except CapabilityError as exc:
    text = str(exc)
    assert "mrv1 does not support kv_cache_dtype=fp8 on cpu (it supports: auto)" in text, text
    assert "runner=fp8kv" in text, text
    assert exc.forced == ("kv_cache_dtype",), exc.forced
# A built-in runner handed it by hand refuses it, through the same judge (unserved).
try:
    MRV1Runner()._check(Decision(kv_cache_dtype="fp8"), "cpu", tensor_parallel_size=1)
    raise AssertionError("mrv1 accepted kv_cache_dtype=fp8")
except RunnerError as exc:
    assert "does not serve kv_cache_dtype=fp8 on cpu" in str(exc), exc

out = io.StringIO()
with redirect_stdout(out):
    code = main(["explain", "DenseLM", "--platform", "cpu", "--policy", "policy.yaml",
                 "--set", "runner=fp8kv"])
assert code == 0 and "kv_cache_dtype" in out.getvalue(), out.getvalue()
out = io.StringIO()
with redirect_stdout(out):
    main(["plugins"])
assert "cudagraph none; no breakable capture; no torch.compile; kv_cache_dtype auto, fp8" in (
    out.getvalue()
), out.getvalue()
print("ok")
'''


def readme_edits() -> dict[str, str]:
    """The docs section's python blocks: file named on the first line -> the lines to add."""
    text = (REPO / "docs" / "policy-reference.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start : end if end != -1 else len(text)]
    edits = {}
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        first, _, body = block.partition("\n")
        edits[first.removeprefix("# ").split(":")[0]] = body
    return edits


def test_a_new_decision_field_needs_two_package_files_and_its_runner(tmp_path: Path) -> None:
    edits = readme_edits()
    assert sorted(edits) == sorted(PLACES)
    root = copy_package(tmp_path / "src")
    for name, body in edits.items():
        where, anchor = PLACES[name]
        path = root / name
        source = path.read_text()
        assert source.count(anchor) == 1, f"{name}: the anchor of the docs' block moved"
        added = body + anchor if where == "before" else anchor + body
        path.write_text(source.replace(anchor, added))
    original = copy_package(tmp_path / "original")
    assert changed_files(original / "interlock", root / "interlock") == sorted(PLACES)
    site = tmp_path / "site"
    _plugin_distribution(site)
    work = tmp_path / "work"
    work.mkdir()
    (work / "policy.yaml").write_text(POLICY)
    (work / "checks.py").write_text(CHECKS)
    done = python_in(
        root, str(work / "checks.py"), cwd=work, pythonpath=[site],
        env={"INTERLOCK_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def _plugin_distribution(site: Path) -> None:
    """The test plugin, installed as a distribution registering it on the entry point."""
    info = site / "fp8kv_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fp8kv-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[interlock.plugins]\nfp8kv = fp8kv_plugin\n")
    (site / "fp8kv_plugin.py").write_text(PLUGIN)
