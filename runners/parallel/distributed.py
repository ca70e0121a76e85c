"""Joining a tensor-parallel group on torch.distributed, and rank 0's control channel.

Every rank joins through a TCPStore rendezvous: on one machine rank 0 hosts the store
and the workers it spawned connect to it; under ``torchrun`` the addresses come from
the launcher's environment (its c10d rendezvous, ``MASTER_ADDR``/``MASTER_PORT``).

Two process groups:

* the **control** group (gloo, on the host): rank 0 broadcasts each message (the load
  order, each step's batch, stop) to the others. A worker waits on it while the engine
  is idle, so its timeout is long; a rank that dies closes its sockets and the
  broadcast fails at once.
* the **tensor-parallel** group (gloo on CPU, NCCL on CUDA/ROCm) for the model's
  collectives, with a bounded timeout (``INTERLOCK_TP_TIMEOUT`` seconds, default 30),
  which also bounds the rendezvous.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from interlock.core.errors import InputError, InterlockError
from interlock.core.platform import PLATFORMS, distributed_backend
from interlock.runners.parallel import shm
from interlock.runners.parallel.group import TensorParallel

TIMEOUT_ENV = "INTERLOCK_TP_TIMEOUT"
THREADS_ENV = "INTERLOCK_TP_THREADS"
DEFAULT_TIMEOUT_S = 30.0
#: A worker waits for rank 0's next message as long as the engine stays idle.
CONTROL_TIMEOUT = timedelta(days=365)
KEY_PREFIX = "interlock-tp"
_HEADER = struct.Struct("<q")
_INLINE = 4096  # bytes broadcast every message; longer ones take a second broadcast


class TensorParallelError(InterlockError, RuntimeError):
    """A tensor-parallel run that cannot go on: a rank failed, died or never joined."""

    kind = "runtime"


@dataclass(frozen=True)
class Rendezvous:
    """Where and as whom a process joins the group."""

    host: str
    port: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host_store: bool  # this process runs the TCPStore server
    launcher: str  # "torch.multiprocessing" or "torchrun"

    @classmethod
    def from_torchrun(cls) -> Rendezvous | None:
        """The rendezvous torchrun set up for this process, or None outside torchrun."""
        env = os.environ
        if "TORCHELASTIC_RUN_ID" not in env or "RANK" not in env:
            return None
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local, local_world = int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])
            host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
        except (KeyError, ValueError) as exc:
            raise TensorParallelError(
                f"torchrun environment is incomplete or invalid ({exc}); expected RANK, "
                "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
            ) from None
        agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return cls(host, port, rank, world, local, local_world, rank == 0 and not agent_store,
                   "torchrun")


def timeout_s() -> float:
    """The bound on collectives and rendezvous, from ``INTERLOCK_TP_TIMEOUT``."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:
        raise InputError(
            f"{TIMEOUT_ENV}={text!r} is invalid; allowed: seconds, a number in (0, 86400)"
        )
    return value


def backend_for(device_type: str) -> str:
    """The torch.distributed backend of the model's collectives on a device type."""
    backend = distributed_backend(device_type)
    if backend is None:
        served = ", ".join(
            f"{p.name} ({p.distributed_backend})" for p in PLATFORMS.values()
            if p.distributed_backend is not None
        )
        raise InputError(
            f"tensor parallelism on {device_type} has no torch.distributed backend here; "
            f"allowed platforms: {served}"
        )
    return backend


def connect_store(rdzv: Rendezvous, timeout: float) -> dist.TCPStore:
    """The rendezvous store (served here when ``rdzv.host_store``), bounded by ``timeout``."""
    try:
        return dist.TCPStore(
            rdzv.host, rdzv.port, rdzv.world_size, is_master=rdzv.host_store,
            timeout=timedelta(seconds=timeout), wait_for_workers=False,
        )
    except (RuntimeError, OSError) as exc:
        raise TensorParallelError(
            f"rank {rdzv.rank}: cannot reach the rendezvous store at {rdzv.host}:{rdzv.port} "
            f"within {timeout:g} s ({exc})"
        ) from None


def join_control(rdzv: Rendezvous, store: dist.Store, timeout: float) -> Channel:
    """Wait (at most ``timeout``) until every rank reached the store, then join the default
    (control) group; returns rank 0's channel to the others."""
    key = f"{KEY_PREFIX}/joined"
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while (joined := store.add(key, 0)) < rdzv.world_size:
        if time.monotonic() > deadline:
            raise TensorParallelError(
                f"rank {rdzv.rank}: only {joined} of {rdzv.world_size} ranks joined the "
                f"rendezvous at {rdzv.host}:{rdzv.port} within {timeout:g} s "
                f"({TIMEOUT_ENV} sets the bound)"
            )
        time.sleep(0.01)
    try:
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(f"{KEY_PREFIX}/pg", store), rank=rdzv.rank,
            world_size=rdzv.world_size, timeout=CONTROL_TIMEOUT,
        )
    except (RuntimeError, OSError) as exc:
        raise TensorParallelError(
            f"rank {rdzv.rank}: the {rdzv.world_size} ranks did not all join within "
            f"{timeout:g} s ({_first_line(exc)})"
        ) from None
    return Channel(rdzv.rank)


def join_tensor_parallel(
    rdzv: Rendezvous, device: torch.device, timeout: float
) -> TensorParallel:
    """The model's group over every rank, on the device's backend, bounded by ``timeout``.
    Called by every rank, in the same order, after the load order."""
    backend = backend_for(device.type)
    group = dist.new_group(backend=backend, timeout=timedelta(seconds=timeout))
    fast, carried = collectives_for(rdzv, device)
    tp = TensorParallel(rdzv.rank, rdzv.world_size, group, collectives=carried)
    if fast:
        tp.shm = shm.SharedMemoryCollectives(group, rdzv.rank, rdzv.world_size, timeout)
    return tp


def collectives_for(rdzv: Rendezvous, device: torch.device) -> tuple[bool, str]:
    """Whether the model's collectives go through shared memory, and what carries them
    (with why). ``INTERLOCK_TP_COLLECTIVES=shm`` that cannot be honoured is an error."""
    wanted = shm.choice()
    backend = backend_for(device.type)
    if device.type != "cpu":
        why = f"{backend}: shared memory serves CPU ranks"
    elif wanted == "gloo":
        why = f"gloo: {shm.CHOICE_ENV}=gloo"
    elif rdzv.local_world_size != rdzv.world_size:
        why = (f"gloo: the group spans hosts ({rdzv.local_world_size} of "
               f"{rdzv.world_size} ranks here)")
    elif (missing := shm.unavailable()) is not None:
        why = f"gloo: {missing}"
    else:
        return True, "shared memory (float32 on one host; gloo for other dtypes)"
    if wanted == "shm":
        raise InputError(f"{shm.CHOICE_ENV}=shm cannot be honoured: {why.split(': ', 1)[1]}")
    return False, why


def set_threads(device: torch.device, ranks_here: int) -> None:
    """On CPU each rank computes with its share of this machine's cores (``cores // ranks``,
    or ``INTERLOCK_TP_THREADS`` threads each)."""
    if device.type != "cpu":
        return
    text = os.environ.get(THREADS_ENV)
    if text is not None:
        if not text.isdigit() or int(text) < 1:
            raise TensorParallelError(
                f"{THREADS_ENV}={text!r} is invalid; allowed: an integer >= 1"
            )
        torch.set_num_threads(int(text))
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // ranks_here))


class Channel:
    """Rank 0's messages to every other rank, broadcast on the control group.

    Each message is a fixed-size broadcast holding its length and, when it fits, the
    bytes; a longer one takes a second broadcast of the rest.
    """

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._buffer = torch.zeros(_INLINE, dtype=torch.uint8)

    def send(self, payload: bytes) -> None:
        head = _HEADER.pack(len(payload)) + payload[: _INLINE - _HEADER.size]
        self._buffer[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        dist.broadcast(self._buffer, src=0)
        rest = payload[_INLINE - _HEADER.size :]
        if rest:
            dist.broadcast(torch.frombuffer(bytearray(rest), dtype=torch.uint8), src=0)

    def receive(self) -> bytes:
        dist.broadcast(self._buffer, src=0)
        raw = self._buffer.numpy().tobytes()
        (length,) = _HEADER.unpack_from(raw)
        inline = raw[_HEADER.size : _HEADER.size + min(length, _INLINE - _HEADER.size)]
        missing = length - len(inline)
        if missing <= 0:
            return inline
        rest = torch.empty(missing, dtype=torch.uint8)
        dist.broadcast(rest, src=0)
        return inline + rest.numpy().tobytes()


def error_key(rank: int) -> str:
    return f"{KEY_PREFIX}/error/{rank}"


def report_error(store: dist.Store | None, rank: int, error: BaseException) -> None:
    """Leave a rank's error where rank 0 looks for it (best effort: the store may be gone)."""
    if store is None:
        return
    try:
        store.set(error_key(rank), f"{type(error).__name__}: {error}"[:2000])
    except (RuntimeError, OSError):
        pass


def reported_error(store: dist.Store, rank: int) -> str | None:
    try:
        if store.check([error_key(rank)]):
            return store.get(error_key(rank)).decode(errors="replace")
    except (RuntimeError, OSError):
        pass
    return None


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
