"""`policy table`, `check` and `diff` on modest policies, third hostile pass (issue 38, item 2):
the domain enumerates the distinctions rules make, bounded past a limit and saying so."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def _three_key_rules(n: int) -> str:
    """Issue 51 item 11: rules of three config conditions each, on keys of their own."""
    return "".join(
        f"  - id: site-{i}\n"
        f"    when: {{config: {{\"k{i}a\": {{gt: {i}}}, \"k{i}b\": {{gt: {i}}}, "
        f"\"k{i}c\": {{gt: {i}}}}}}}\n"
        f"    set: {{runner: mrv1}}\n"
        f"    reason: generated site rule {i} of three config conditions\n"
        for i in range(n)
    )


@pytest.fixture
def three_keys(tmp_path: Path) -> tuple[Path, Path]:
    base, site = tmp_path / "base.yaml", tmp_path / "site.yaml"
    base.write_text(with_rules("", base=MINIMAL_BASE))
    site.write_text(with_rules(_three_key_rules(20), base=MINIMAL_BASE))
    return base, site


def test_51_11_config_states_are_one_per_set_of_rules_that_hold(
    three_keys: tuple[Path, Path]
) -> None:
    # Past the bound, each key's values alone (120 states here) made no rule of several keys
    # match: they decide as "none given" does, and are left out. What stays: no model config,
    # none given, and each rule's three conditions together.
    _, site = three_keys
    domain = Domain.of(load_policy([str(site)]))
    assert domain.bounded
    assert len(domain.config_states) == 1 + 1 + 20


def test_51_11_diff_resolves_each_class_of_contexts_once(
    three_keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every context was resolved under both policies; the contexts in which the same rules
    # match decide alike, so one resolution per class and env state does.
    from interlock.policy import diff as diff_module
    from interlock.policy import resolution

    base, site = (load_policy([str(p)]) for p in three_keys)
    calls = []
    real = resolution._resolve

    def counted(*args: object) -> object:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(resolution, "_resolve", counted)
    result = diff_module.diff_policies(base, site)
    size = result.domain.size()
    assert len(calls) <= 2 * (1 + 20) * len(result.domain.env_states) < size
    # The same changes as resolving every context under both policies.
    monkeypatch.setattr(resolution, "_resolve", real)
    naive = set()
    for context in result.domain.contexts():
        before, after = resolution.resolve(base, context), resolution.resolve(site, context)
        for name in ("runner", "cudagraph", "breakable", "compile", "capture_sizes"):
            if getattr(before.decision, name) != getattr(after.decision, name):
                naive.add((name, context))
    assert naive and {(c.field, c.context) for c in result.changes} == naive


def test_51_11_a_domain_past_the_bound_is_refused_naming_its_size(
    cli: Any, three_keys: tuple[Path, Path]
) -> None:
    base, site = three_keys
    size = Domain.of(load_policy([str(base)]), load_policy([str(site)])).size()
    result = cli("diff", base, site, "--max-contexts", str(size - 1))
    assert result.code == 1
    assert f"the domain holds {size} contexts, over the bound of {size - 1}" in result.err
    assert f"give --max-contexts {size}" in result.err
    assert cli("diff", base, site, "--max-contexts", str(size)).code == 0
    table = cli("table", "--policy", site, "--max-contexts", "10")
    assert table.code == 1 and "rows, over the bound of 10" in table.err
    assert cli("table", "--policy", site, "--platform", "cpu").code == 0
