"""The floor under CPU tensor parallelism: one all-reduce and all-gather between two local
processes at the sizes a decode step sends, through the shared-memory collectives interlock
uses on one host and through gloo, a gloo broadcast and point-to-point exchange of the same
size, and for scale a plain socket round trip between two processes. Each figure is the
median of per-call times (figures in BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from interlock.runners.parallel.shm import SharedMemoryCollectives


def _rank(rank: int, world: int, port: int, calls: int, hidden: int, vocab: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    x = torch.randn(hidden)
    other = torch.empty(hidden)
    shard = torch.randn(2, vocab // world)
    gathered = [torch.empty_like(shard) for _ in range(world)]

    def exchange() -> None:  # with the one other rank
        peer = 1 - rank
        received = dist.irecv(other, peer)
        dist.isend(x, peer).wait()
        received.wait()

    fast = SharedMemoryCollectives(None, rank, world, timeout=30.0)
    for name, op in (
        (f"shared-memory all_reduce of {hidden} floats", lambda: fast.all_reduce(x)),
        (f"shared-memory all_gather of 2x{vocab // world} floats",
         lambda: fast.all_gather(shard)),
        (f"gloo all_reduce of {hidden} floats", lambda: dist.all_reduce(x)),
        (f"gloo all_gather of 2x{vocab // world} floats",
         lambda: dist.all_gather(gathered, shard)),
        (f"gloo broadcast of {hidden} floats", lambda: dist.broadcast(x, 0)),
        (f"gloo isend/irecv exchange of {hidden} floats", exchange),
    ):
        for _ in range(calls // 10):
            op()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            op()
            times.append(time.perf_counter() - start)
        if rank == 0:
            print(f"{name}: median {statistics.median(times) * 1e6:.1f} us per call, "
                  f"mean {statistics.fmean(times) * 1e6:.1f} us")
    fast.close()
    dist.destroy_process_group()


def _echo(child: socket.socket, nbytes: int, calls: int) -> None:
    message = b"x" * nbytes
    for _ in range(calls):
        received = 0
        while received < nbytes:
            received += len(child.recv(nbytes - received))
        child.sendall(message)


def socket_round_trip(nbytes: int, calls: int) -> float:
    """Seconds per round trip of ``nbytes`` over a Unix socket pair between two processes.

    The echoing process is spawned: this one may hold torch's threads, and a forked child of
    a threaded process can deadlock."""
    parent, child = socket.socketpair()
    message = b"x" * nbytes
    echo = mp.get_context("spawn").Process(target=_echo, args=(child, nbytes, calls))
    echo.start()
    start = time.perf_counter()
    for _ in range(calls):
        parent.sendall(message)
        received = 0
        while received < nbytes:
            received += len(parent.recv(nbytes - received))
    elapsed = time.perf_counter() - start
    echo.join()
    return elapsed / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, torch {torch.__version__}, 2 ranks, 1 thread each")
    mp.spawn(_rank, args=(2, args.port, args.calls, args.hidden, args.vocab), nprocs=2)
    seconds = socket_round_trip(4 * args.hidden, args.calls * 10)
    print(f"for scale, a socket-pair round trip of {4 * args.hidden} bytes between two "
          f"processes: {seconds * 1e6:.0f} us")


if __name__ == "__main__":
    main()
