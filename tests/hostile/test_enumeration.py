"""`policy table`, `check` and `diff` on modest policies, third hostile pass (issue 38, item 2):
the domain enumerates the distinctions rules make, bounded past a limit and saying so."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from policy_texts import MINIMAL_BASE, with_rules

from interlock.policy.domain import MAX_EXTRAS, Domain
from interlock.policy.loader import load_policy

REPO = Path(__file__).resolve().parents[2]


def _config_rules(n: int) -> str:
    return "".join(
        f"  - id: config-{i}\n"
        f"    when: {{config: {{\"key{i}\": {{gt: {i}}}}}}}\n"
        f"    set: {{cudagraph: piecewise}}\n"
        f"    reason: generated config rule {i} for the enumeration bound\n"
        for i in range(n)
    )


def _feature_rules(n: int) -> str:
    return "".join(
        f"  - id: feature-{i}\n"
        f"    when: {{features: {{f{i}: {{in: [1, 2, 3]}}}}}}\n"
        f"    set: {{breakable: true}}\n"
        f"    reason: generated feature rule {i} for the enumeration bound\n"
        for i in range(n)
    )


@pytest.fixture(params=["config", "features"])
def modest(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    """20 rules with one config condition each, or 16 with one feature condition each (the
    cases of the issue), and the same less its last rule."""
    rules = _config_rules if request.param == "config" else _feature_rules
    count = 20 if request.param == "config" else 16
    full, less = tmp_path / "full.yaml", tmp_path / "less.yaml"
    full.write_text(with_rules(rules(count), base=MINIMAL_BASE))
    less.write_text(with_rules(rules(count - 1), base=MINIMAL_BASE))
    return full, less


def _policy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "interlock.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_2_the_domain_is_bounded_and_says_so(modest: tuple[Path, Path]) -> None:
    full, _ = modest
    start = time.monotonic()
    domain = Domain.of(load_policy([str(full)]))
    assert domain.bounded, "the issue's policies are past the bound"
    assert domain.size() <= len(domain.architectures) * len(list(domain.places())) * MAX_EXTRAS
    assert time.monotonic() - start < 10


@pytest.mark.slow  # three interpreters per case
def test_2_table_check_and_diff_finish(modest: tuple[Path, Path]) -> None:
    full, less = modest
    table = _policy("table", "--policy", str(full), "--platform", "cpu")
    assert table.returncode == 0, table.stderr
    check = _policy("check", "--policy", str(full))
    assert check.returncode in (0, 1), check.stderr
    assert "bounded-domain" in check.stdout + check.stderr
    diff = _policy("diff", str(less), str(full))
    assert diff.returncode == 0, diff.stderr
    assert "bounded:" in diff.stdout


def test_2_a_small_domain_is_every_combination(tmp_path: Path) -> None:
    """Below the bound nothing changes: two config keys, every truth assignment of both."""
    path = tmp_path / "small.yaml"
    path.write_text(with_rules(_config_rules(2), base=MINIMAL_BASE))
    domain = Domain.of(load_policy([str(path)]))
    assert domain.bounded == ()
    assert len(domain.config_states) == 1 + 2 * 2
