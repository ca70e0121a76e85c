"""The vLLM release a policy names in its files' `version:` (policy/release.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlock.policy.loader import load_policy
from interlock.policy.release import describe, mismatch, outside, releases

REPO = Path(__file__).resolve().parents[2]

BASE = """\
schema_version: 1
version: "{version}"
defaults: {{runner: mrv2, cudagraph: full_and_piecewise, breakable: false, compile: true}}
"""


def _policy(tmp_path: Path, *versions: str) -> object:
    paths = []
    for i, version in enumerate(versions):
        path = tmp_path / f"p{i}.yaml"
        path.write_text(BASE.format(version=version))
        paths.append(str(path))
    return load_policy(paths, use_cache=False)


def test_the_shipped_policy_names_its_release_at_its_version_line() -> None:
    (release,) = releases(load_policy(["@shipped"]))
    assert release.text == "0.33.0 to 0.34.0"
    line = (REPO / "policies.yaml").read_text().split("\n")[release.location.line - 1]
    assert line == 'version: "vllm-0.33.0..0.34.0"'


@pytest.mark.parametrize(
    ("version", "inside"),
    [("0.33.0", True), ("0.33", True), ("0.33.0+cu130", True), ("0.33.0rc1", True),
     ("0.33.0.post1", True), ("0.33.1", False), ("0.31.0", False)],
)
def test_builds_count_as_their_release_number(tmp_path: Path, version: str,
                                              inside: bool) -> None:
    assert (not outside(_policy(tmp_path, "vllm-0.33.0"), version)) is inside


def test_a_range_covers_both_ends_and_what_lies_between(tmp_path: Path) -> None:
    policy = _policy(tmp_path, "vllm-0.27.1..0.33.0")
    assert describe(policy).startswith("for vLLM 0.27.1 to 0.33.0 (version: ")
    assert [not outside(policy, v) for v in ("0.27.0", "0.27.1", "0.30.0", "0.33.0.dev3",
                                             "0.33.1")] == [False, True, True, True, False]


@pytest.mark.parametrize("version", ["site-2026.12", "vllm-banana", "vllm-0.33.0..0.27.1",
                                     "vllm-", "vllm-0.33.0..", "VLLM 0.33.0"])
def test_a_version_that_is_no_release_names_none_and_says_so(tmp_path: Path,
                                                             version: str) -> None:
    policy = _policy(tmp_path, version)
    assert releases(policy) == ()
    assert mismatch(policy, "0.31.0", "given") is None
    assert describe(policy) == (f"for no vLLM release: no file's version is vllm-X.Y.Z "
                                f"({version!r} at {tmp_path / 'p0.yaml'}:2)")


def test_a_site_layer_inherits_and_every_named_release_must_cover(tmp_path: Path) -> None:
    site = _policy(tmp_path, "vllm-0.33.0", "site-1")
    assert [r.location.file for r in releases(site)] == [str(tmp_path / "p0.yaml")]
    both = _policy(tmp_path, "vllm-0.33.0", "vllm-0.31.0")
    assert mismatch(both, "0.31.0", "detected") == (
        "vLLM 0.31.0 (detected) is outside what the policy is written for: vLLM 0.33.0 "
        f"(version: {tmp_path / 'p0.yaml'}:2)"
    )
