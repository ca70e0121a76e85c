"""Tensor parallelism under hostile conditions (issue 28: S3, U5, C16)."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from interlock.core.env import Settings
from interlock.core.errors import InputError
from interlock.runners.batching.sampling import SamplingParams
from interlock.runners.parallel.distributed import (
    ParallelSettings,
    Rendezvous,
    TensorParallelError,
    connect_store,
)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _listening(pid: int) -> list[str]:
    """The local addresses of the TCP sockets process ``pid`` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            raw, port = local.split(":")
            packed = bytes.fromhex(raw)
            # /proc prints each 32-bit word in host (little-endian) order.
            words = b"".join(packed[i : i + 4][::-1] for i in range(0, len(packed), 4))
            assert len(raw) == width
            found.append(f"{ipaddress.ip_address(words)}:{int(port, 16)}")
    return found


def _loopback_only(addresses: list[str]) -> bool:
    return all(ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback for a in addresses)


@pytest.mark.slow
@linux
def test_s3_every_listening_socket_of_a_tp_run_binds_loopback_only() -> None:
    from interlock.llm import LLM

    before = _listening(os.getpid())
    with LLM("demo", max_num_seqs=1, tensor_parallel_size=2) as llm:
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        runner = llm.step_loop.runner
        pids = [os.getpid(), *runner.worker_pids]
        sockets = {pid: _listening(pid) for pid in pids}
        rdzv = runner._rdzv
        store = runner._store
        assert rdzv is not None and store is not None
        # The store (rank 0) and gloo's pairs (every rank) listen, on loopback only.
        assert len(sockets[os.getpid()]) > len(before), sockets
        assert all(sockets[pid] for pid in runner.worker_pids), sockets
        assert all(_loopback_only(found) for found in sockets.values()), sockets
        # The keys live under a random per-run namespace: a client that does not know it
        # finds none of them.
        assert len(rdzv.namespace) == 32 and int(rdzv.namespace, 16) >= 0
        assert not store.check(["interlock-tp/joined"])
        assert store.check([rdzv.key("joined")])
        first = rdzv.namespace
    with LLM("demo", max_num_seqs=1, tensor_parallel_size=2) as llm:
        assert llm.step_loop.runner._rdzv.namespace != first


@linux
def test_s3_a_single_process_run_listens_on_nothing() -> None:
    from interlock.llm import LLM

    before = _listening(os.getpid())
    LLM("demo", max_num_seqs=1).generate([[1, 2]], SamplingParams(temperature=0, max_tokens=2))
    assert _listening(os.getpid()) == before


@linux
def test_s3_under_torchrun_rank_0_binds_master_addr(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"TORCHELASTIC_RUN_ID": "job7", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "TORCHELASTIC_USE_AGENT_STORE": "false"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rdzv = Rendezvous.from_torchrun(ParallelSettings())
    assert rdzv is not None and rdzv.host_store and rdzv.namespace == "job7"
    monkeypatch.setenv("INTERLOCK_TP_NAMESPACE", "mine")
    rdzv = Rendezvous.from_torchrun(ParallelSettings.of(Settings.read()))
    assert rdzv is not None and rdzv.namespace == "mine" and not rdzv.single_host
    store = connect_store(rdzv, 2.0)
    assert f"127.0.0.1:{port}" in _listening(os.getpid())
    del store


@pytest.mark.parametrize(
    ("name", "value"),
    [("MASTER_PORT", "99999"), ("MASTER_PORT", "x"), ("RANK", "²"), ("WORLD_SIZE", "0"),
     ("RANK", "5")],
)
def test_u5_torchrun_environment_values_are_named(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    env = {"TORCHELASTIC_RUN_ID": "j", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for key, text in {**env, name: value}.items():
        monkeypatch.setenv(key, text)
    with pytest.raises(InputError) as caught:
        Rendezvous.from_torchrun(ParallelSettings())
    assert name in str(caught.value) and value in str(caught.value)


@pytest.mark.parametrize("value", ["99999999999", "²", "0", "-1", "1e3", ""])
def test_u5_tp_threads_is_named_and_exits_1(cli, monkeypatch, value: str) -> None:
    monkeypatch.setenv("INTERLOCK_TP_THREADS", value)
    res = cli("run", "--model", "demo", "--tensor-parallel-size", "2",
              "--prompt-token-ids", "1,2", "--max-tokens", "1", "--json")
    assert res.code == 1, res.err
    message = res.json()["error"]["message"]
    assert f"INTERLOCK_TP_THREADS={value!r} is invalid" in message
    assert "Traceback" not in res.err


def test_u5_rendezvous_failures_are_one_line() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rdzv = Rendezvous("127.0.0.1", port, 1, 2, 1, 2, False, "test")
    with pytest.raises(TensorParallelError) as caught:
        connect_store(rdzv, 1.0)
    assert "\n" not in str(caught.value)


@linux
@pytest.mark.slow
def test_u5_a_stopped_worker_is_named_not_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    from interlock.llm import LLM
    from interlock.runners.contract import Decision

    monkeypatch.setenv("INTERLOCK_TP_TIMEOUT", "10")
    llm = LLM("demo", max_num_seqs=1, tensor_parallel_size=2, decision=Decision(runner="mrv1"))
    engine = llm.step_loop
    engine.add_request(engine.make_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=50)))
    engine.step()
    [pid] = engine.runner.worker_pids
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        with pytest.raises(TensorParallelError) as caught:
            for _ in range(50):
                engine.step()
    finally:
        if _exists(pid):
            os.kill(pid, signal.SIGCONT)
    assert f"rank 1 (pid {pid}) is stopped" in str(caught.value), str(caught.value)
    assert time.monotonic() - start < 40
    llm.close()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_c16_graphs_fail_capture_env_exits_1(cli, monkeypatch) -> None:
    monkeypatch.setenv("INTERLOCK_GRAPHS_FAIL_CAPTURE", "abc")
    res = cli("run", "--model", "demo", "--prompt-token-ids", "1,2", "--max-tokens", "1",
              "--json")
    assert res.code == 1, res.err
    assert "Traceback" not in res.err
    assert "INTERLOCK_GRAPHS_FAIL_CAPTURE='abc' is invalid" in res.json()["error"]["message"]

