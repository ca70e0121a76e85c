"""pytest plugin (entry point ``pytest11``): collects ``*.tests.yaml`` policy tests files.

Each case and each invariant becomes one test item, run against the policy the file names
(``policy: ["@shipped", site.yaml]``), else the policy beside it (``X.yaml`` for
``X.tests.yaml``): a tests file says what it tests, so ``INTERLOCK_POLICY`` is not
read here. A case that warns (an architecture outside the catalog) emits a pytest
warning at the case's line. The project's pytest collects the shipped
``policies.tests.yaml`` through ``testpaths``. pytest imports this module at
every start, so it imports nothing of the policy engine until a file matches.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from interlock.policy.model import Policy
    from interlock.policy.policytest import TestRun
    from interlock.policy.testfile import LoadedCase, LoadedInvariant

SUFFIX = ".tests.yaml"
#: Tests file name -> the run its items add their results to (for the coverage summary).
_RUNS = pytest.StashKey[dict[str, "TestRun"]]()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.name.endswith(SUFFIX):
        return PolicyTestsFile.from_parent(parent, path=file_path)
    return None


class PolicyCaseFailed(Exception):
    """A case whose decision differs from what it expects; carries the rendered report."""


class PolicyTestsFile(pytest.File):
    def collect(self) -> list[pytest.Item]:
        from interlock.core.errors import PolicyError
        from interlock.policy.loader import load_policy_sources, read_source
        from interlock.policy.policytest import TestRun
        from interlock.policy.testfile import load_tests, policy_path_for

        name = self._display(self.path)
        try:
            tests = load_tests(self.path, name)
        except PolicyError as exc:
            raise self.CollectError(str(exc)) from None
        files = tests.policy
        if files is None:
            policy_path = policy_path_for(self.path)
            if not policy_path.is_file():
                raise self.CollectError(
                    f"{name}: no policy {policy_path.name} beside it to test; name the policy "
                    f'in the file, e.g. policy: ["@shipped", site.yaml]'
                )
            files = ((self._display(policy_path), policy_path),)
        try:
            policy = load_policy_sources([(n, read_source(p, n)) for n, p in files])
        except PolicyError as exc:
            layer = (
                f'; to test it layered on the shipped policy, add policy: ["@shipped", '
                f"{files[0][1].name}] to {name}"
                if tests.policy is None and "defaults must set" in str(exc) else ""
            )
            raise self.CollectError(str(exc) + layer) from None
        run = self.config.stash.setdefault(_RUNS, {})[name] = TestRun(policy)
        items: list[pytest.Item] = [
            PolicyCaseItem.from_parent(self, name=case.name, case=case, run=run)
            for case in tests.cases
        ]
        items += [
            PolicyInvariantItem.from_parent(
                self, name=f"invariant: {inv.name}", invariant=inv, policy=policy
            )
            for inv in tests.invariants
        ]
        return items

    def _display(self, path: Path) -> str:
        """``path`` relative to the rootdir when below it, as locations in reports show it."""
        try:
            return str(path.relative_to(self.config.rootpath))
        except ValueError:
            return str(path)


class PolicyCaseItem(pytest.Item):
    def __init__(self, *, case: LoadedCase, run: TestRun, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.run = run

    def runtest(self) -> None:
        from interlock.policy.policytest import render_result, run_case
        from interlock.vllm.stage import decide_with_release

        result = run_case(self.run.policy, self.case, decide=decide_with_release)
        self.run.results.append(result)
        for warning in result.warnings:
            self.warn(pytest.PytestWarning(warning))
        if not result.passed:
            raise PolicyCaseFailed("\n".join(render_result(result)))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, PolicyCaseFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        where = self.case.at()
        return self.path, where.line - 1, f"policy case: {self.name}"


class PolicyInvariantItem(pytest.Item):
    def __init__(self, *, invariant: LoadedInvariant, policy: Policy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.invariant = invariant
        self.policy = policy

    def runtest(self) -> None:
        from interlock.plugins.capabilities import capabilities_for
        from interlock.policy.invariants import check_invariants

        stage = capabilities_for(self.policy)
        (result,) = check_invariants(self.policy, [self.invariant], capabilities=stage)
        if not result.passed:
            raise PolicyCaseFailed("\n".join(result.render()))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, PolicyCaseFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int, str]:
        where = self.invariant.at()
        return self.path, where.line - 1, f"policy invariant: {self.invariant.name}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    runs = {name: run for name, run in config.stash.get(_RUNS, {}).items() if run.results}
    if not runs:
        return
    from interlock.policy.policytest import render_coverage

    terminalreporter.section("policy rule coverage")
    for name, run in runs.items():
        for line in render_coverage(run):
            terminalreporter.write_line(f"{name}: {line}")
