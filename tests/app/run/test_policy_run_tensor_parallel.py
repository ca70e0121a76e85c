"""`policy run --tensor-parallel-size`: the size reaches the policy, the split is reported,
torchrun's ranks on two simulated machines give the tokens of one rank, bad sizes are
refused before anything starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from checkout import REPO

ROOT = REPO
ARGS = ("--max-tokens", "5", "--prompt-token-ids", "5,9,17,3", "--ignore-eos", "--json")


def test_two_ranks_on_one_machine_report_the_split(policy_run, tiny_llama):
    one = policy_run("--model", tiny_llama, *ARGS).json()
    two = policy_run("--model", tiny_llama, "--tensor-parallel-size", "2", *ARGS).json()
    assert two["outputs"][0]["token_ids"] == one["outputs"][0]["token_ids"]
    assert two["context"]["features"]["tensor_parallel_size"] == 2
    assert two["tensor_parallel"] == {
        "size": 2, "backend": "gloo", "launcher": "torch.multiprocessing",
        "heads_per_rank": 2, "kv_heads_per_rank": 1, "notes": [],
        "collectives": "shared memory (float32 on one host; gloo for other dtypes)",
    }
    assert one["tensor_parallel"] is None


def test_a_size_the_model_cannot_split_into_is_refused_naming_the_numbers(policy_run, tiny_llama):
    result = policy_run("--model", tiny_llama, "--tensor-parallel-size", "3")
    assert result.code == 1
    assert "tensor_parallel_size=3 cannot split LlamaForCausalLM" in result.err
    assert "its 4 attention heads do not divide into 3 ranks" in result.err


def test_the_feature_and_the_flag_must_agree(policy_run, tiny_llama):
    result = policy_run("--model", tiny_llama, "--feature", "tensor_parallel_size=2")
    assert result.code == 1
    assert "disagrees with --tensor-parallel-size 1" in result.err


@pytest.mark.slow
def test_torchrun_on_two_simulated_machines_gives_the_tokens_of_one_rank(policy_run, tiny_llama):
    """Two torchrun launchers (--nnodes 2 --nproc-per-node 1) meeting at a c10d rendezvous
    on 127.0.0.1, as two machines would."""
    one = policy_run("--model", tiny_llama, *ARGS).json()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    launch = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
        "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
        "interlock-test", "-m", "interlock.cli", "run", "--model", str(tiny_llama),
        "--tensor-parallel-size", "2", *ARGS,
    ]
    nodes = [subprocess.Popen(launch, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=240)
            outputs.append((node.returncode, out, err))
    finally:
        for node in nodes:
            node.kill()
    assert [code for code, _, _ in outputs] == [0, 0], [err[-2000:] for _, _, err in outputs]
    docs = [json.loads(out) for _, out, _ in outputs if out.strip()]
    assert len(docs) == 1  # rank 0 prints; the other rank serves it
    assert docs[0]["outputs"][0]["token_ids"] == one["outputs"][0]["token_ids"]
    assert docs[0]["tensor_parallel"]["launcher"] == "torchrun"


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_bad_timeouts_are_refused(policy_run, tiny_llama, monkeypatch, value):
    monkeypatch.setenv("INTERLOCK_TP_TIMEOUT", value)
    result = policy_run("--model", tiny_llama, "--tensor-parallel-size", "2")
    assert result.code == 1
    assert f"INTERLOCK_TP_TIMEOUT={value!r} is invalid" in result.err


def test_ctrl_c_stops_every_rank(tiny_llama):
    """SIGINT to the foreground process group, as a terminal's Ctrl-C sends it, mid-run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    # As a terminal starts it: with Ctrl-C's default action, even where this test runs
    # under a shell's background job, whose children inherit SIGINT ignored.
    terminal = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler);"
                " runpy.run_module('interlock.cli', run_name='__main__', alter_sys=True)")
    command = [sys.executable, "-c", terminal, "run", "--model", str(tiny_llama),
               "--tensor-parallel-size", "2", "--max-tokens", "120", "--ignore-eos",
               "--set", "cudagraph=none"]
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (workers := _children(run.pid)) or not all(map(_has_torch, workers)):
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "no worker started"
            time.sleep(0.05)
        # Loading or generating: either way every rank must stop. Once the worker maps
        # torch it has read everything rank 0 sends it at spawn, so rank 0 has left the
        # window in which it ignores Ctrl-C (which a loaded machine can stretch past a
        # fixed delay); soon after, so that the run is surely not over (with shared-memory
        # collectives its 120 tokens take well under 3 s on an idle machine).
        time.sleep(0.5)
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid), f"rank process {pid} survived"


def _has_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and "spawn" in _cmdline(stat.parent):
            found.append(int(stat.parent.name))
    return found


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
