"""Joining a tensor-parallel group on torch.distributed, and rank 0's control channel.

Every rank joins through a TCPStore rendezvous: on one machine rank 0 hosts the store
and the workers it spawned connect to it; under ``torchrun`` the addresses come from
the launcher's environment (its c10d rendezvous, ``MASTER_ADDR``/``MASTER_PORT``).

The store has no authentication, so on one machine everything listens on the loopback
interface only: the store on 127.0.0.1, and gloo's and NCCL's sockets on the loopback
interface (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``). Every key lives under a
random per-run namespace (:attr:`Rendezvous.namespace`): the spawned workers get it from
rank 0; under torchrun every rank reads ``INTERLOCK_TP_NAMESPACE`` (else torchrun's run
id), so another job's ranks on the same store cannot collide with this run's keys.

What the environment says of the run (``TP_COLLECTIVES``, ``TP_TIMEOUT``, ``TP_THREADS``
and ``TP_NAMESPACE`` of :mod:`interlock.core.env`) is read once where it starts
(``LLM(...)``, a torchrun worker's entry) into :class:`ParallelSettings`, which every rank
gets with its :class:`Rendezvous`: no rank reads the environment for it mid-run.

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
import secrets
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from interlock.core.env import TP_COLLECTIVES, TP_THREADS, TP_TIMEOUT, Settings
from interlock.core.errors import InputError, InterlockError
from interlock.core.platform import PLATFORMS, distributed_backend
from interlock.runners.parallel import shm
from interlock.runners.parallel.group import TensorParallel

DEFAULT_TIMEOUT_S = 30.0
#: A worker waits for rank 0's next message as long as the engine stays idle.
CONTROL_TIMEOUT = timedelta(days=365)
KEY_PREFIX = "interlock-tp"
TORCHRUN = "torchrun"
#: The loopback address every socket of a single-machine run listens on.
LOOPBACK = "127.0.0.1"
MAX_THREADS = 4096
_HEADER = struct.Struct("<q")
_INLINE = 4096  # bytes broadcast every message; longer ones take a second broadcast


class TensorParallelError(InterlockError, RuntimeError):
    """A tensor-parallel run that cannot go on: a rank failed, died or never joined."""

    kind = "runtime"


@dataclass(frozen=True)
class ParallelSettings:
    """A run's tensor-parallel settings from the environment, parsed (:meth:`of`) where the
    run starts."""

    #: How ranks on one host exchange tensors on CPU: auto, shm or gloo.
    collectives: str = shm.AUTO
    #: The bound on every collective and on the rendezvous, in seconds.
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: Torch threads of each rank on CPU (None: the host's cores shared among its ranks).
    threads: int | None = None
    #: Under torchrun, the namespace of the run's keys (None: torchrun's run id).
    namespace: str | None = None

    @classmethod
    def of(cls, settings: Settings) -> ParallelSettings:
        """The values ``settings`` carries; one of another form is an ``InputError`` naming
        its variable and the values it allows."""
        return cls(shm.collectives_choice(settings.tp_collectives),
                   _timeout_s(settings.tp_timeout), _threads(settings.tp_threads),
                   settings.tp_namespace)


@dataclass(frozen=True)
class Rendezvous:
    """Where and as whom a process joins the group, and the run's settings every rank
    keeps to."""

    host: str
    port: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host_store: bool  # this process runs the TCPStore server
    launcher: str  # "torch.multiprocessing" or "torchrun"
    #: Every key of this run lives under it (see the module's docstring).
    namespace: str = ""
    settings: ParallelSettings = field(default_factory=ParallelSettings)

    @property
    def single_host(self) -> bool:
        """Every rank runs on this machine (spawned by rank 0): only loopback is used."""
        return self.launcher != TORCHRUN

    def key(self, name: str) -> str:
        return f"{KEY_PREFIX}/{self.namespace}/{name}" if self.namespace else f"{KEY_PREFIX}/{name}"

    @classmethod
    def from_torchrun(cls, settings: ParallelSettings) -> Rendezvous | None:
        """The rendezvous torchrun set up for this process (from the environment torchrun
        gives it: this process's start), or None outside torchrun."""
        env = os.environ
        if "TORCHELASTIC_RUN_ID" not in env or "RANK" not in env:
            return None
        missing = [name for name in _TORCHRUN_ENV if name not in env]
        if missing:
            raise InputError(
                f"torchrun environment is incomplete: {', '.join(missing)} not set; expected "
                + ", ".join(_TORCHRUN_ENV)
            )
        numbers = {name: _env_int(name, low, high) for name, (low, high) in _TORCHRUN_INTS.items()}
        rank, world = numbers["RANK"], numbers["WORLD_SIZE"]
        local, local_world = numbers["LOCAL_RANK"], numbers["LOCAL_WORLD_SIZE"]
        if rank >= world or local >= local_world:
            raise InputError(
                f"torchrun environment is inconsistent: RANK={rank} of WORLD_SIZE={world}, "
                f"LOCAL_RANK={local} of LOCAL_WORLD_SIZE={local_world}"
            )
        agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        namespace = settings.namespace or env["TORCHELASTIC_RUN_ID"]
        return cls(env["MASTER_ADDR"], numbers["MASTER_PORT"], rank, world, local, local_world,
                   rank == 0 and not agent_store, TORCHRUN, namespace, settings)


_TORCHRUN_INTS = {
    "RANK": (0, 1 << 20), "WORLD_SIZE": (1, 1 << 20), "LOCAL_RANK": (0, 1 << 20),
    "LOCAL_WORLD_SIZE": (1, 1 << 20), "MASTER_PORT": (1, 65535),
}
_TORCHRUN_ENV = ("MASTER_ADDR", *_TORCHRUN_INTS)


def _env_int(name: str, low: int, high: int) -> int:
    """The integer environment value ``name`` in ``low..high``; InputError naming it."""
    return _int_named(name, os.environ[name], low, high)


def _int_named(name: str, text: str, low: int, high: int) -> int:
    """``text``, the value of variable ``name``, as an integer in ``low..high``."""
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise InputError(f"{name}={text!r} is invalid; allowed: an integer in {low}..{high}")
    return int(text)


def new_namespace() -> str:
    """A fresh random namespace for one run's keys."""
    return secrets.token_hex(16)


def _loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    net = Path("/sys/class/net")
    if net.is_dir():
        for entry in sorted(net.iterdir()):
            try:
                if int((entry / "flags").read_text(), 16) & 0x8:  # IFF_LOOPBACK
                    return entry.name
            except (OSError, ValueError):
                continue
    return "lo0" if sys.platform == "darwin" else "lo"


def use_loopback(rdzv: Rendezvous) -> None:
    """On one machine, gloo's and NCCL's own sockets listen on the loopback interface only
    (set before this process creates a group; NCCL reads it when it first connects)."""
    if rdzv.single_host:
        interface = _loopback_interface()
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface


def _timeout_s(text: str | None) -> float:
    """The bound on collectives and rendezvous, from ``INTERLOCK_TP_TIMEOUT``."""
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:  # NaN fails too
        raise InputError(
            f"{TP_TIMEOUT.name}={text!r} is invalid; allowed: seconds, a number in (0, 86400)"
        )
    return value


def _threads(text: str | None) -> int | None:
    """``INTERLOCK_TP_THREADS`` (threads per rank on CPU), None when unset."""
    return None if text is None else _int_named(TP_THREADS.name, text, 1, MAX_THREADS)


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
    """The rendezvous store (served here when ``rdzv.host_store``), bounded by ``timeout``.

    torch's store server listens on every interface; served here it listens on a socket
    bound first to 127.0.0.1 on one machine, or to ``MASTER_ADDR`` under torchrun."""
    try:
        listen_fd = _listening_socket(rdzv) if rdzv.host_store else None
        store = dist.TCPStore(
            rdzv.host, rdzv.port if listen_fd is None else _bound_port(listen_fd),
            rdzv.world_size, is_master=rdzv.host_store, timeout=timedelta(seconds=timeout),
            wait_for_workers=False, master_listen_fd=listen_fd,
        )
    except (RuntimeError, OSError) as exc:
        raise TensorParallelError(
            f"rank {rdzv.rank}: cannot reach the rendezvous store at {rdzv.host}:{rdzv.port} "
            f"within {timeout:g} s ({_first_line(exc)})"
        ) from None
    use_loopback(rdzv)
    return store


def _listening_socket(rdzv: Rendezvous) -> int:
    """A listening TCP socket for the store, bound to loopback on one machine (else to
    ``rdzv.host``); its descriptor, owned by the store from here on."""
    host = LOOPBACK if rdzv.single_host else rdzv.host
    family, kind, proto, _, address = socket.getaddrinfo(
        host, rdzv.port, type=socket.SOCK_STREAM
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(max(128, rdzv.world_size))
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _bound_port(fd: int) -> int:
    probe = socket.socket(fileno=os.dup(fd))
    try:
        return int(probe.getsockname()[1])
    finally:
        probe.close()


def join_control(rdzv: Rendezvous, store: dist.Store, timeout: float) -> Channel:
    """Wait (at most ``timeout``) until every rank reached the store, then join the default
    (control) group; returns rank 0's channel to the others."""
    key = rdzv.key("joined")
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while (joined := store.add(key, 0)) < rdzv.world_size:
        if time.monotonic() > deadline:
            raise TensorParallelError(
                f"rank {rdzv.rank}: only {joined} of {rdzv.world_size} ranks joined the "
                f"rendezvous at {rdzv.host}:{rdzv.port} within {timeout:g} s "
                f"({TP_TIMEOUT.name} sets the bound)"
            )
        time.sleep(0.01)
    try:
        dist.init_process_group(
            "gloo", store=dist.PrefixStore(rdzv.key("pg"), store), rank=rdzv.rank,
            world_size=rdzv.world_size, timeout=CONTROL_TIMEOUT,
        )
    except (RuntimeError, OSError) as exc:
        raise TensorParallelError(
            f"rank {rdzv.rank}: the {rdzv.world_size} ranks did not all join within "
            f"{timeout:g} s ({_first_line(exc)})"
        ) from None
    return Channel(rdzv.rank, timeout)


def join_tensor_parallel(
    rdzv: Rendezvous, device: torch.device, timeout: float, channel: Channel | None = None
) -> TensorParallel:
    """The model's group over every rank, on the device's backend, bounded by ``timeout``.
    Called by every rank, in the same order, after the load order; ``channel`` (the
    control channel) then carries its messages through the group's shared segment too."""
    backend = backend_for(device.type)
    group = dist.new_group(backend=backend, timeout=timedelta(seconds=timeout))
    fast, carried = collectives_for(rdzv, device)
    tp = TensorParallel(rdzv.rank, rdzv.world_size, group, collectives=carried)
    if fast:
        tp.shm = shm.SharedMemoryCollectives(group, rdzv.rank, rdzv.world_size, timeout)
    if channel is not None:
        channel.shm = tp.shm
    return tp


def collectives_for(rdzv: Rendezvous, device: torch.device) -> tuple[bool, str]:
    """Whether the model's collectives go through shared memory, and what carries them
    (with why). ``INTERLOCK_TP_COLLECTIVES=shm`` that cannot be honoured is an error."""
    wanted = rdzv.settings.collectives
    backend = backend_for(device.type)
    if device.type != "cpu":
        why = f"{backend}: shared memory serves CPU ranks"
    elif wanted == "gloo":
        why = f"gloo: {TP_COLLECTIVES.name}=gloo"
    elif rdzv.local_world_size != rdzv.world_size:
        why = (f"gloo: the group spans hosts ({rdzv.local_world_size} of "
               f"{rdzv.world_size} ranks here)")
    elif (missing := shm.unavailable()) is not None:
        why = f"gloo: {missing}"
    else:
        return True, "shared memory (float32 on one host; gloo for other dtypes)"
    if wanted == "shm":
        raise InputError(f"{TP_COLLECTIVES.name}=shm cannot be honoured: {why.split(': ', 1)[1]}")
    return False, why


def set_threads(device: torch.device, rdzv: Rendezvous) -> None:
    """On CPU each rank computes with its share of this machine's cores (``cores // ranks``
    on this host, or ``INTERLOCK_TP_THREADS`` threads each)."""
    if device.type != "cpu":
        return
    count = rdzv.settings.threads
    if count is not None:
        torch.set_num_threads(count)
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // rdzv.local_world_size))


class Channel:
    """Rank 0's messages to every other rank, broadcast on the control group.

    Each message is a fixed-size broadcast holding its length and, when it fits, the
    bytes; a longer one takes a second broadcast of the rest. Once the group's
    shared-memory segment exists (``shm``, from the model's first collective, before the
    first step on every rank), messages go through it instead: a gloo broadcast costs as
    much as a gloo all-reduce, and a worker that gets its step late makes rank 0 wait.
    """

    def __init__(self, rank: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.rank = rank
        #: The model group's shared-memory collectives, when it has them (set by
        #: ``join_tensor_parallel``).
        self.shm: shm.SharedMemoryCollectives | None = None
        #: How long rank 0 waits for every rank to take a message (a worker waits for the
        #: next one as long as the engine stays idle).
        self.timeout = timeout
        self._buffer = torch.zeros(_INLINE, dtype=torch.uint8)

    def send(self, payload: bytes) -> None:
        if self.shm is not None and self.shm.ready:
            self.shm.send(payload)
            return
        head = _HEADER.pack(len(payload)) + payload[: _INLINE - _HEADER.size]
        self._buffer[: len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        self._bounded(self._buffer)
        rest = payload[_INLINE - _HEADER.size :]
        if rest:
            self._bounded(torch.frombuffer(bytearray(rest), dtype=torch.uint8))

    def _bounded(self, tensor: torch.Tensor) -> None:
        """Broadcast from rank 0, failing after ``timeout`` when a rank does not take it
        (stopped, or hung): the control group's own timeout is a year."""
        work = dist.broadcast(tensor, src=0, async_op=True)
        assert work is not None
        if not work.wait(timedelta(seconds=self.timeout)):
            raise TensorParallelError(
                f"a rank did not take rank 0's message within {self.timeout:g} s "
                f"({TP_TIMEOUT.name} sets the bound)"
            )

    def receive(self) -> bytes:
        if self.shm is not None and self.shm.ready:
            return self.shm.receive()
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


def error_key(rdzv: Rendezvous, rank: int) -> str:
    return rdzv.key(f"error/{rank}")


def report_error(store: dist.Store | None, rdzv: Rendezvous, error: BaseException) -> None:
    """Leave a rank's error where rank 0 looks for it (best effort: the store may be gone)."""
    if store is None:
        return
    try:
        store.set(error_key(rdzv, rdzv.rank), summary(error)[:2000])
    except (RuntimeError, OSError):
        pass


def reported_error(store: dist.Store, rdzv: Rendezvous, rank: int) -> str | None:
    try:
        if store.check([error_key(rdzv, rank)]):
            return store.get(error_key(rdzv, rank)).decode(errors="replace")
    except (RuntimeError, OSError):
        pass
    return None


def summary(error: BaseException) -> str:
    """``Type: first line``: torch's errors carry pages of C++ frames after it."""
    return f"{type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
