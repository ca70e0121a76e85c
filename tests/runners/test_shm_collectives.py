"""The shared-memory collectives of one-host tensor parallelism, in real processes: sums
bitwise equal on every rank, chunking past the slot, the gather's layout, rank 0's
messages between them, a SIGKILLed peer named with nothing left in /dev/shm, a rank that
waits for a message without keeping a core busy, and two runs that never share a
segment."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from interlock.core.env import TP_COLLECTIVES
from interlock.runners.parallel import shm

pytestmark = [pytest.mark.skipif(shm.unavailable() is not None,
                                 reason=f"shared memory: {shm.unavailable()}"),
              pytest.mark.slow]  # each test starts ranks in fresh interpreters

SIZES = (576, 1, 0, 7, 300_000)  # the first sizes the slot (1 MiB); the last is chunked
MESSAGES = (0, 5, 3_000_000, 17)  # bytes; the third takes three rounds of the slot


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs(rank: int, seed: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed * 1000 + rank * 7 + n))


def _sum_in_rank_order(world: int, seed: int, n: int) -> torch.Tensor:
    total = _inputs(0, seed, n).clone()
    for r in range(1, world):
        total += _inputs(r, seed, n)
    return total


def _collectives(rank: int, world: int, port: int, seed: int, out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    fast = shm.SharedMemoryCollectives(None, rank, world, timeout=20.0)
    results = []
    for n in SIZES:
        x = _inputs(rank, seed, n)
        fast.all_reduce(x)
        results.append(bool(torch.equal(x, _sum_in_rank_order(world, seed, n))))
    shard = _inputs(rank, seed, 24).view(2, 12)
    gathered = fast.all_gather(shard)
    want = torch.cat([_inputs(r, seed, 24).view(2, 12) for r in range(world)])
    results.append(bool(torch.equal(gathered, want)))
    for n in MESSAGES:  # rank 0's messages, between collectives, as a step's are
        payload = bytes((seed + i) % 256 for i in range(n))
        if rank == 0:
            fast.send(payload)
        else:
            results.append(fast.receive() == payload)
        x = _inputs(rank, seed, 5)
        fast.all_reduce(x)
        results.append(bool(torch.equal(x, _sum_in_rank_order(world, seed, 5))))
    out[rank] = results
    fast.close()
    dist.destroy_process_group()


def _run_group(world: int, seed: int) -> dict:
    manager = mp.get_context("spawn").Manager()
    out = manager.dict()
    mp.start_processes(_collectives, args=(world, _port(), seed, out), nprocs=world,
                       start_method="spawn")
    return dict(out)


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_gets_the_sum_in_rank_order_bitwise(world: int) -> None:
    results = _run_group(world, seed=world)
    assert sorted(results) == list(range(world))
    assert all(all(r) for r in results.values()), results


def _leftovers(pids: set[int]) -> list[str]:
    return [p.name for p in shm.SHM_DIR.iterdir()
            if p.name.startswith(shm.PREFIX) and int(p.name.split("-")[2]) in pids]


def _killed_peer(rank: int, port: int, out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    fast = shm.SharedMemoryCollectives(None, rank, 2, timeout=20.0)
    fast.all_reduce(torch.ones(8))  # the segment exists, mapped by both, unlinked
    out[f"pid{rank}"] = os.getpid()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        fast.all_reduce(torch.ones(8))
        out["error"] = None
    except shm.CollectiveError as exc:
        out["error"] = str(exc)
    out["seconds"] = time.monotonic() - start


def test_a_sigkilled_peer_is_named_and_leaves_no_segment() -> None:
    context = mp.get_context("spawn")
    out = context.Manager().dict()
    procs = [context.Process(target=_killed_peer, args=(r, port, out))
             for port in [_port()] for r in range(2)]
    for p in procs:
        p.start()
    procs[0].join(60)
    assert procs[0].exitcode == 0
    # rank 1 is a zombie until joined here: the wait must see through that
    assert out["error"] is not None
    assert f"rank 1 (pid {out['pid1']}) died during a shared-memory all-reduce" in out["error"]
    assert out["seconds"] < 10
    procs[1].join(10)
    assert procs[1].exitcode == -signal.SIGKILL
    assert _leftovers({out["pid0"], out["pid1"]}) == []


def _idle_worker(rank: int, port: int, out: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    fast = shm.SharedMemoryCollectives(None, rank, 2, timeout=20.0)
    fast.all_reduce(torch.ones(8))
    if rank == 0:
        time.sleep(2.0)  # an engine with nothing to do
        fast.send(b"step")
        return
    cpu, wall = time.process_time(), time.monotonic()
    out["message"] = fast.receive()
    out["cpu"], out["wall"] = time.process_time() - cpu, time.monotonic() - wall


def test_a_rank_waiting_for_a_message_does_not_keep_a_core_busy() -> None:
    context = mp.get_context("spawn")
    out = context.Manager().dict()
    procs = [context.Process(target=_idle_worker, args=(r, port, out))
             for port in [_port()] for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert out["message"] == b"step"
    assert out["wall"] > 1.5
    # it sleeps between looks after its first milliseconds: a busy wait would use ~2 s
    assert out["cpu"] < 0.25 * out["wall"], dict(out)


def test_two_runs_at_once_never_share_a_segment() -> None:
    context = mp.get_context("spawn")
    groups = [context.Process(target=_run_and_check, args=(seed,)) for seed in (11, 12)]
    for g in groups:
        g.start()
    for g in groups:
        g.join(120)
    assert [g.exitcode for g in groups] == [0, 0]


def _run_and_check(seed: int) -> None:
    results = _run_group(2, seed)
    if not all(all(r) for r in results.values()):
        os._exit(1)


def test_a_stale_segment_of_a_dead_process_is_swept(tmp_path: Path) -> None:
    context = mp.get_context("spawn")
    dead = context.Process(target=time.sleep, args=(0,))
    dead.start()
    dead.join()
    stale = shm.SHM_DIR / f"{shm.PREFIX}{dead.pid}-0123456789abcdef"
    mine = shm.SHM_DIR / f"{shm.PREFIX}{os.getpid()}-0123456789abcdef"
    stale.write_bytes(b"x")
    mine.write_bytes(b"x")
    try:
        shm.sweep()
        assert not stale.exists() and mine.exists()
    finally:
        stale.unlink(missing_ok=True)
        mine.unlink(missing_ok=True)


def test_the_choice_is_read_and_refused_clearly() -> None:
    from dataclasses import replace

    from interlock.core.env import Settings
    from interlock.core.errors import InputError
    from interlock.runners.parallel.distributed import (
        ParallelSettings,
        Rendezvous,
        collectives_for,
    )

    here = Rendezvous("127.0.0.1", 1, 0, 2, 0, 2, True, "torch.multiprocessing")
    spans = Rendezvous("10.0.0.1", 1, 0, 4, 0, 2, True, "torchrun")
    cpu = torch.device("cpu")
    assert collectives_for(here, cpu) == (
        True, "shared memory (float32 on one host; gloo for other dtypes)")
    assert collectives_for(spans, cpu) == (
        False, "gloo: the group spans hosts (2 of 4 ranks here)")
    # The variable is read where the run starts; every rank has it in its rendezvous.
    def told(rdzv: Rendezvous, value: str) -> Rendezvous:
        settings = ParallelSettings.of(Settings.read({TP_COLLECTIVES.name: value}))
        return replace(rdzv, settings=settings)

    assert collectives_for(told(here, "gloo"), cpu) == (
        False, "gloo: INTERLOCK_TP_COLLECTIVES=gloo")
    with pytest.raises(InputError, match="=shm cannot be honoured: the group spans hosts"):
        collectives_for(told(spans, "shm"), cpu)
    with pytest.raises(InputError, match="INTERLOCK_TP_COLLECTIVES='fast' is invalid"):
        told(here, "fast")
