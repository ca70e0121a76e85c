"""`policy vllm serve` runs vLLM as its child and checks its startup log against the decision.

The engine is a fake `vllm` on PATH (tests/app/fake_vllm_engine.py, standard library only)
printing vLLM 0.33.0's own startup lines as the flags and env it is given decide them, or
misbehaving as FAKE_VLLM_MODE says. Each case checks the line on stderr, the decision
record and the exit status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from interlock.vllm.releases import RELEASES, UnknownRelease
from interlock.vllm.startup_log import EngineCheck

from .fake_vllm_engine import SOURCE

REPO = Path(__file__).resolve().parents[2]
WARNING = "policy vllm: WARNING: THE ENGINE DID NOT CONFIRM THE DECISION: "
BOUND = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH", "INTERLOCK_DECISION_LOG")


class Serve:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        fake = bin_dir / "vllm"
        fake.write_text(SOURCE.format(python=sys.executable))
        fake.chmod(0o755)
        self.log = tmp_path / "decisions.jsonl"
        self.signals = tmp_path / "signals.txt"
        self.pids = tmp_path / "pids.txt"
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in BOUND},
            "PATH": f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}",
            "PYTHONPATH": str(REPO),
            "FAKE_VLLM_LINGER": "0.3",
            "FAKE_VLLM_SIGNALS": str(self.signals),
        }

    def model(self, arch: str) -> Path:
        path = self.tmp / arch
        path.mkdir(exist_ok=True)
        (path / "config.json").write_text(json.dumps({"architectures": [arch]}))
        return path

    def argv(self, arch: str, *options: str) -> list[str]:
        return [sys.executable, "-m", "interlock.cli", "vllm", "serve", "--platform", "cuda",
                "--device-arch", "sm_90", "--decision-log", str(self.log), *options,
                str(self.model(arch)), "--port", "8123"]

    def __call__(
        self, arch: str, *options: str, mode: str = "match", **env: str
    ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
        proc = subprocess.run(
            self.argv(arch, *options), capture_output=True, text=True, timeout=60,
            env={**self.env, "FAKE_VLLM_MODE": mode, **env}, cwd=REPO, check=False,
        )
        return proc, self.record()

    def record(self) -> dict[str, Any] | None:
        if not self.log.exists():
            return None
        lines = self.log.read_text().splitlines()
        assert len(lines) <= 1, "one record per start"
        return json.loads(lines[0]) if lines else None


@pytest.fixture
def serve(tmp_path: Path) -> Serve:
    return Serve(tmp_path)


def engine_of(record: dict[str, Any] | None) -> dict[str, Any]:
    assert record is not None and record["command"] == "policy vllm serve"
    return record["engine"]


def test_an_engine_that_runs_the_decision_is_verified(serve: Serve) -> None:
    proc, record = serve("LlamaForCausalLM")
    assert proc.returncode == 0, proc.stderr
    engine = engine_of(record)
    assert engine["verified"] is True and engine["ended_by"] == "ready"
    assert engine["seen"] == {
        "vllm_version": "0.33.0", "config_line": "core.py:140", "mode": "VLLM_COMPILE",
        "cudagraph_mode": "FULL_AND_PIECEWISE", "runner": "mrv2",
        "runner_line": "gpu_worker.py:513", "ready_line": "entry.py:139", "breakable": False,
    }
    assert record["runner"] == {"name": "mrv2", "plugin": None, "distribution": "vllm",
                                "version": "0.33.0"}
    assert "policy vllm: verified: the engine runs the decision" in proc.stderr
    assert WARNING not in proc.stderr
    # Its output is passed through, stdout to stdout and stderr to stderr.
    assert "[entry.py:139] Starting vLLM server on" in proc.stdout
    assert "some unrelated output" in proc.stderr


def test_breakable_and_v1_decisions_are_verified_by_what_is_logged_and_not(
    serve: Serve,
) -> None:
    proc, record = serve("GlmMoeDsaForCausalLM")  # breakable on CUDA: compile off
    assert proc.returncode == 0, proc.stderr
    engine = engine_of(record)
    assert engine["verified"] is True
    assert engine["seen"]["breakable"] is True and engine["seen"]["mode"] == "NONE"
    serve.log.unlink()
    proc, record = serve("LlamaForCausalLM", VLLM_USE_V2_MODEL_RUNNER="0")
    engine = engine_of(record)
    assert engine["verified"] is True and engine["seen"]["runner"] == "mrv1"
    assert "runner_line" not in engine["seen"]


def test_v1_where_v2_was_decided_is_caught(serve: Serve) -> None:
    proc, record = serve("LlamaForCausalLM", mode="v1")
    assert proc.returncode == 0  # the engine's own status: it ran
    engine = engine_of(record)
    assert engine["verified"] is False and engine["ended_by"] == "ready"
    assert engine["seen"]["runner"] == "mrv1"
    (warning,) = [ln for ln in proc.stderr.splitlines() if ln.startswith(WARNING)]
    assert "runner: decided mrv2, but the engine came up without logging " in warning
    assert engine["problems"] == [warning[len(WARNING):]]


def test_strict_stops_a_contradicting_engine_with_exit_4(serve: Serve) -> None:
    proc, record = serve("LlamaForCausalLM", "--strict", mode="breakable",
                         FAKE_VLLM_LINGER="30")
    assert proc.returncode == 4, proc.stderr
    engine = engine_of(record)
    assert engine["verified"] is False and engine["ended_by"] == "mismatch"
    assert engine["problems"] == [
        "breakable: decided false, but vLLM logged 'Breakable CUDA graph enabled' "
        "[breakable_cudagraph.py:294]"
    ]
    assert serve.signals.read_text() == "SIGTERM\n"  # stopped, not left serving


def test_an_engine_that_prints_nothing_fails_the_check_after_the_startup_time(
    serve: Serve,
) -> None:
    start = time.monotonic()
    proc, record = serve("LlamaForCausalLM", "--startup-timeout", "1.5", "--strict",
                         mode="silent", FAKE_VLLM_LINGER="30")
    assert proc.returncode == 4 and time.monotonic() - start < 20
    engine = engine_of(record)
    assert (engine["verified"], engine["ended_by"], engine["seen"]) == (False, "timeout", {})
    assert "did not come up within the startup time of 1.5 s" in engine["problems"][0]
    assert WARNING in proc.stderr
    # Without --strict it is a warning: the engine keeps serving and its status passes.
    serve.log.unlink()
    proc, record = serve("LlamaForCausalLM", "--startup-timeout", "0.5", mode="silent",
                         FAKE_VLLM_LINGER="2")
    assert proc.returncode == 0 and engine_of(record)["ended_by"] == "timeout"


@pytest.mark.parametrize(("mode", "status", "why"), [
    ("early", 3, "the engine exited with status 3 before it came up"),
    ("killed", 128 + signal.SIGKILL, "the engine was killed by SIGKILL before it came up"),
])
def test_an_engine_that_ends_before_it_is_up_is_reported(
    serve: Serve, mode: str, status: int, why: str
) -> None:
    proc, record = serve("LlamaForCausalLM", mode=mode)
    assert proc.returncode == status, proc.stderr
    engine = engine_of(record)
    assert engine["verified"] is False and engine["ended_by"] == "exited"
    assert engine["problems"] == [why]
    assert engine["seen"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"  # what it did log
    assert f"{WARNING}{why}" in proc.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is not running; it only waits for its parent to collect it.
    stat_path = Path(f"/proc/{pid}/stat")
    return not (stat_path.exists() and stat_path.read_text().split(") ")[1].startswith("Z"))


def test_ctrl_c_reaches_the_engine_and_leaves_no_process(serve: Serve) -> None:
    proc = subprocess.Popen(
        serve.argv("LlamaForCausalLM"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=REPO,
        env={**serve.env, "FAKE_VLLM_LINGER": "60", "FAKE_VLLM_PIDS": str(serve.pids)},
    )
    try:
        deadline = time.monotonic() + 30
        while serve.record() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine_of(serve.record())["verified"] is True
        engine_pid, worker_pid = map(int, serve.pids.read_text().split())
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to `policy`
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err  # the engine's status, passed through
    assert serve.signals.read_text() == "SIGINT\n"
    assert not _alive(engine_pid) and not _alive(worker_pid)


def test_the_check_reads_every_known_release_and_each_process_prefix() -> None:
    decision = {"runner": "mrv2", "cudagraph": "piecewise", "breakable": False,
                "compile": True}
    config = ("Initializing a V1 LLM engine (v{v}) with config: model='m', compilation_config="
              "{{'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': "
              "<CUDAGraphMode.PIECEWISE: 1>}}, kernel_config=None")
    for version in [r.version for r in RELEASES if r.logs and r.logs.runner_v2]:
        check = EngineCheck(decision, version)
        # 0.29/0.30: the worker's prefix is added to the line; 0.31+: the formatter's own.
        assert check.feed(f"(EngineCore_DP0 pid=7) INFO 12-01 10:00:00 [core.py:1] "
                          f"{config.format(v=version)}\n") is None
        assert check.feed("\x1b[36m(EngineCore pid=7)\x1b[0m INFO 12-01 10:00:01 "
                          "[gpu_worker.py:2] Using V2 Model Runner") is None
        # Text that only mentions a message is not the message.
        assert check.feed("echo Starting vLLM server on nothing") is None
        verdict = check.feed("INFO 12-01 10:00:02 [entry.py:139] Starting vLLM server on x")
        assert verdict is not None and verdict.verified, verdict
    # A release whose wheel was not read is not guessed at: its lines could mean otherwise
    # (0.34.0 stopped logging the runner), so its log is refused, not read as another's.
    assert EngineCheck(decision, "0.33.0.post1").release.version == "0.33.0"
    for unread in ("0.33.2", "0.30.1", "0.35.0"):
        with pytest.raises(UnknownRelease, match=f"vLLM {unread} is a release interlock has"):
            EngineCheck(decision, unread)
    with pytest.raises(UnknownRelease, match="startup log was not read"):
        EngineCheck(decision, "0.26.0")
    with pytest.raises(Exception, match="is not a version"):
        EngineCheck(decision, "latest")


def test_a_healthy_034_engine_runs_v2_without_saying_so() -> None:
    """0.34.0 has only Model Runner V2 and logs no runner line: its silence is V2, not V1."""
    config = ("Initializing a V1 LLM engine (v0.34.0) with config: model='m', compilation_config="
              "{'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': "
              "<CUDAGraphMode.PIECEWISE: 1>}, kernel_config=None")
    ready = "INFO 12-01 10:00:02 [entry.py:139] Starting vLLM server on x"
    decision = {"runner": "mrv2", "cudagraph": "piecewise", "breakable": False, "compile": True}
    check = EngineCheck(decision, "0.34.0")
    assert check.feed(f"INFO 12-01 10:00:00 [core.py:153] {config}") is None
    verdict = check.feed(ready)
    assert verdict is not None and verdict.verified, verdict.problems
    assert verdict.seen["runner"] == "mrv2"
    # The same silence on 0.33.0 is V1.
    check = EngineCheck(decision, "0.33.0")
    check.feed(f"INFO 12-01 10:00:00 [core.py:140] {config.replace('0.34.0', '0.33.0')}")
    verdict = check.feed(ready)
    assert verdict is not None and not verdict.verified
    assert "it runs V1" in verdict.problems[0]
