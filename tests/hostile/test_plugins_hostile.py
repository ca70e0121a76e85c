"""Items 9, 11, 18, 22, 23 of the hostile-inputs issue: plugins that misbehave."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interlock import plugins

SPECS = """
from interlock.plugins import PlatformSupport, RunnerSpec, hookimpl
{imports}
@hookimpl
def interlock_runner_specs():
    {before}
    return [RunnerSpec(name={name!r}, description="hostile", plugin_api=">=1.0,<2",
                       platforms={{"cpu": PlatformSupport(cudagraph={{"none"}})}},
                       factory={factory!r}{fields})]
"""


def specs(
    name: str, factory: str = "nowhere:Runner", before: str = "pass", base: str | None = None
) -> str:
    """A plugin module declaring runner ``name``. ``base``: the built-in runner (``mrv1``)
    its factory subclasses, whose unsupported set it then declares too, since `policy
    plugins` flags a subclass claiming more than its base serves."""
    imports = f"from interlock.runners.{base}.plugin import SPEC as BASE" if base else ""
    fields = ", unsupported=BASE.unsupported" if base else ""
    return SPECS.format(name=name, factory=factory, before=before, imports=imports,
                        fields=fields)


def test_09_runner_factory_that_fails_to_import_is_a_plugin_error(install, cli) -> None:
    install(
        "broken-factory",
        {"brokenf": "hostile_bf"},
        {
            "hostile_bf": specs("brokenf", "hostile_bf_runner:Runner"),
            "hostile_bf_runner": "import no_such_module_anywhere\n",
        },
    )
    assert plugins.load_registry().find("brokenf") is not None  # declarations are fine
    res = cli(
        "run",
        "--model",
        "demo",
        "--set",
        "runner=brokenf",
        "--set",
        "cudagraph=none",
        "--max-tokens",
        "1",
    )
    assert res.code == 3
    assert "Traceback" not in res.err
    assert "factory hostile_bf_runner:Runner" in res.err
    assert "ModuleNotFoundError" in res.err and "hostile_bf_runner.py:1" in res.err


@pytest.mark.parametrize(
    "body, shown",
    [
        ("import sys\nsys.exit(3)\n", "called sys.exit(3)"),
        ("raise KeyboardInterrupt\n", "raised KeyboardInterrupt"),
        ("raise GeneratorExit('odd')\n", "raised GeneratorExit: odd"),
    ],
)
def test_11_base_exceptions_from_plugins_are_quarantined(install, cli, body, shown) -> None:
    install("exits", {"exits": "hostile_exit"}, {"hostile_exit": body})
    res = cli("plugins", "--json")
    assert res.code == 1  # a failed plugin; every other plugin still listed
    (record,) = [p for p in res.json()["plugins"] if p["name"] == "exits"]
    assert record["status"] == "failed" and shown in record["detail"]
    assert cli("explain", "LlamaForCausalLM", "--platform", "cuda").code == 0


def test_11_real_ctrl_c_during_plugin_import_still_stops(install, tmp_path: Path) -> None:
    marker = tmp_path / "importing"
    site = install(
        "slow",
        {"slow": "hostile_slow"},
        {
            "hostile_slow": f"import pathlib, time\npathlib.Path({str(marker)!r}).touch()\n"
            "time.sleep(60)\n"
        },
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "interlock.cli", "plugins"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "Traceback" not in err and "policy: interrupted" in err


NOISY = specs("noisy", "hostile_noisy_runner:Runner", before="print('hello from the hook')",
              base="mrv1")
NOISY_RUNNER = """
print("hello from the import")
from interlock.runners.mrv1.runner import MRV1Runner

class Runner(MRV1Runner):
    name = "noisy"

    def __init__(self):
        print("hello from the factory")
        super().__init__()

    def execute(self, batch):
        print("hello from execute")
        return super().execute(batch)
"""


@pytest.mark.parametrize("command", ["explain", "plugins", "run"])
def test_18_plugin_prints_never_reach_json_stdout(install, cli, command) -> None:
    install(
        "noisy",
        {"noisy": "hostile_noisy"},
        {
            "hostile_noisy": "print('hello from the plugin module')\n" + NOISY,
            "hostile_noisy_runner": NOISY_RUNNER,
        },
    )
    argv = {
        "explain": [
            "explain",
            "LlamaForCausalLM",
            "--platform",
            "cpu",
            "--set",
            "runner=noisy",
            "--json",
        ],
        "plugins": ["plugins", "--json"],
        "run": ["run", "--model", "demo", "--set", "runner=noisy", "--max-tokens", "2", "--json"],
    }[command]
    res = cli(*argv)
    assert res.code == 0, res.err
    res.json()  # one JSON document, nothing else
    assert "hello from" in res.err


def test_22_editing_entry_points_in_place_invalidates_the_cache(install, tmp_path) -> None:
    site = install("edited", {"first": "hostile_first"}, {"hostile_first": specs("first")})
    assert plugins.load_registry().find("first") is not None
    (site / "hostile_second.py").write_text(specs("second"))
    info = next(site.glob("edited-*.dist-info"))
    before = info.stat()
    entry_points = info / "entry_points.txt"
    entry_points.write_text(entry_points.read_text() + "second = hostile_second\n")
    os.utime(info, ns=(before.st_atime_ns, before.st_mtime_ns))  # the directory looks unchanged
    os.utime(site, ns=(site.stat().st_atime_ns, site.stat().st_mtime_ns))
    plugins.reset()
    assert plugins.load_registry().find("second") is not None


def test_23_a_third_party_plugin_cannot_shadow_a_builtin(install, cli, monkeypatch) -> None:
    install("shadow-dist", {"mrv2": "hostile_shadow"}, {"hostile_shadow": specs("shadowed")})
    registry = plugins.load_registry()
    assert registry.find("mrv2").plugin.distribution == "interlock"
    res = cli("plugins", "--json")
    (theirs,) = [p for p in res.json()["plugins"] if p["distribution"] == "shadow-dist"]
    assert theirs["status"] == "failed"
    assert "the built-in one is kept" in theirs["detail"]
    assert "interlock" in theirs["detail"] and "shadow-dist 1.0" in theirs["detail"]
    assert cli("explain", "LlamaForCausalLM", "--platform", "cuda").code == 0
    # The disable list picks one of the two by distribution.
    monkeypatch.setenv("INTERLOCK_DISABLE_PLUGINS", "interlock:mrv2")
    plugins.reset()
    registry = plugins.load_registry()
    assert registry.find("shadowed") is not None and registry.find("mrv2") is None
    monkeypatch.setenv("INTERLOCK_DISABLE_PLUGINS", "shadow-dist:mrv2")
    plugins.reset()
    registry = plugins.load_registry()
    assert registry.find("mrv2").plugin.distribution == "interlock"
    assert not registry.failed()
