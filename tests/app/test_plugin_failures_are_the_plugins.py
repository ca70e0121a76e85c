"""Issue 24 item 2: a third-party runner that raises in ``load()`` or ``execute()``, or returns
the wrong number of tokens, makes ``policy run`` exit 3 naming the runner, the plugin, its
distribution and the plugin's own file:line, not "a bug in interlock" (exit 70)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SPECS = """
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl
from interlock.runners.mrv1.plugin import SPEC

@hookimpl
def interlock_runner_specs():
    return [RunnerSpec(name="flaky", description="fails on purpose", plugin_api=">=1.0,<2",
                       platforms=SPEC.platforms, factory="wf_flaky_runner:Runner")]
"""
RUNNER = """
from interlock.runners.contract import RunnerOutput
from interlock.runners.mrv1.runner import MRV1Runner


class Runner(MRV1Runner):
    name = "flaky"

    def load(self, model, kv_cache, decision):
        if {what!r} == "load":
            raise RuntimeError("the flaky runner cannot load")
        super().load(model, kv_cache, decision)

    def execute(self, batch):
        out = super().execute(batch)
        if {what!r} == "execute":
            raise ValueError("the flaky runner broke in execute")
        if {what!r} == "count":
            return RunnerOutput(token_ids=out.token_ids + (7,))
        return out
"""
LINES = {"load": 11, "execute": 17}


@pytest.mark.parametrize("what", ["load", "execute", "count"])
def test_a_failing_plugin_runner_is_exit_3_naming_the_plugin(cli, install, what) -> None:
    site = install("flaky-runners", {"flaky": "wf_flaky"},
                   {"wf_flaky": SPECS, "wf_flaky_runner": RUNNER.format(what=what)})
    res = cli("run", "--model", "demo", "--set", "runner=flaky", "--max-tokens", "2",
              "--prompt-token-ids", "1,2,3")
    assert res.code == 3, res.err
    assert "bug in interlock" not in res.err and "Traceback" not in res.err
    assert "plugin flaky (flaky-runners 1.0)" in res.err
    if what == "count":
        assert "execute() returned 2 token(s) for 1 scheduled sequence(s)" in res.err
    else:
        assert f"failed in {what}()" in res.err
        assert f"(at {site / 'wf_flaky_runner.py'}:{LINES[what]})" in res.err


def test_a_working_plugin_runner_still_runs(cli, install) -> None:
    install("flaky-runners", {"flaky": "wf_flaky"},
            {"wf_flaky": SPECS, "wf_flaky_runner": RUNNER.format(what="nothing")})
    res = cli("run", "--model", "demo", "--set", "runner=flaky", "--max-tokens", "2",
              "--prompt-token-ids", "1,2,3", "--json")
    assert res.code == 0, res.err


@pytest.fixture
def in_checkout() -> Iterator[Path]:
    """A folder inside this checkout, removed afterwards: where `make install` puts a
    plugin (the checkout's .venv), or where a plugin project is developed beside it."""
    folder = Path(tempfile.mkdtemp(dir=REPO, prefix=".test-plugin-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("layout", ["checkout .venv", "editable in the checkout",
                                    "editable outside the checkout"])
def test_the_plugin_line_is_found_wherever_the_plugin_is_installed(
    cli, install, in_checkout: Path, tmp_path: Path, layout: str
) -> None:
    """Issue 43 item 2: interlock's own code is its package's files, not every file under
    the checkout root (which holds the .venv the plugin is installed into)."""
    modules = {"wf_flaky": SPECS, "wf_flaky_runner": RUNNER.format(what="load")}
    venv_site = in_checkout / ".venv" / "lib" / "python3" / "site-packages"
    if layout == "checkout .venv":
        code = install("flaky-runners", {"flaky": "wf_flaky"}, modules, at=venv_site)
    elif layout == "editable in the checkout":  # the metadata in .venv, the code in a project
        code = install("flaky-runners", {"flaky": "wf_flaky"}, modules, at=venv_site,
                       code_at=in_checkout / "flaky-runners" / "src")
    else:
        code = install("flaky-runners", {"flaky": "wf_flaky"}, modules,
                       code_at=tmp_path / "flaky-runners" / "src")
    assert code.is_relative_to(REPO) == (layout != "editable outside the checkout")
    res = cli("run", "--model", "demo", "--set", "runner=flaky", "--max-tokens", "2",
              "--prompt-token-ids", "1,2,3")
    assert res.code == 3, res.err
    assert f"(at {code / 'wf_flaky_runner.py'}:{LINES['load']})" in res.err
