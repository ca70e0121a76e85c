"""Shared-memory collectives for a tensor-parallel group whose ranks share one host.

A gloo collective between two local processes costs 0.5-1.8 ms (docs/benchmarks-history.md,
Tensor parallelism), which a decode step pays ~18 times. The ranks of one host instead meet
in one shared segment (the C side, ``_shm.c``, says how they synchronise and why every
rank's sum is bitwise the same). torch.distributed stays for everything else: the
rendezvous, the control channel, setting this segment up, other dtypes, GPUs, and groups
that span hosts.

The segment is made at the group's first collective and sized from it: a slot per rank of
at least that collective's bytes (and at least ``MIN_SLOT``); a larger collective later is
done in slot-sized pieces. Rank 0 creates it in ``/dev/shm`` under a name of its pid and a
random token (so two runs never share one), every rank maps it, and once all have, rank 0
unlinks the name: the mapping lives on in each process and ends with it, so a rank killed
by SIGKILL leaves nothing behind. A name left by a rank 0 that died between creating and
unlinking (a window of one barrier) is swept by the next run, since its pid is gone.
``/dev/shm`` is everyone's: the segment is created 0600 with ``O_EXCL`` (no link followed,
nothing already there opened), the other ranks map it only as a regular file of this user
of the agreed size, and the sweep believes a name only when its pid is within the kernel's
bound and removes only this user's regular files.
"""

from __future__ import annotations

import importlib
import mmap
import os
import re
import secrets
import stat
import struct
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist

from interlock.core.env import TP_COLLECTIVES
from interlock.core.errors import InputError
from interlock.core.processes import alive, parse_pid

#: Shared memory where it can serve, else gloo.
AUTO = "auto"
CHOICES = (AUTO, "shm", "gloo")
SHM_DIR = Path("/dev/shm")
PREFIX = "interlock-tp-"
MIN_SLOT = 1 << 20
#: How long one look for rank 0's next message lasts before Python checks for signals.
_IDLE_LOOK_S = 0.25
#: A segment's name: the creating pid (at most 7 digits: see ``MAX_PID``), then 16 random hex
#: digits (``secrets.token_hex(8)``).
_NAME = re.compile(rf"{PREFIX}([1-9][0-9]{{0,6}})-[0-9a-f]{{16}}")


class CollectiveError(RuntimeError):
    """A shared-memory collective that could not complete: a peer died or never came."""


def _module() -> ModuleType:
    return importlib.import_module("interlock.runners.parallel._shm")


def unavailable() -> str | None:
    """Why this process cannot use shared-memory collectives, or None."""
    try:
        _module()
    except ImportError as exc:
        return f"the shared-memory extension is not built ({exc})"
    if not SHM_DIR.is_dir() or not os.access(SHM_DIR, os.W_OK):
        return f"{SHM_DIR} is not a writable directory"
    return None


def collectives_choice(given: str | None) -> str:
    """``INTERLOCK_TP_COLLECTIVES`` (read where the run started): auto (the default, for
    None), shm or gloo."""
    text = AUTO if given is None else given
    if text not in CHOICES:
        raise InputError(
            f"{TP_COLLECTIVES.name}={text!r} is invalid; allowed: {', '.join(CHOICES)}"
        )
    return text


def sweep() -> None:
    """Remove this user's segments whose creating process no longer exists.

    Anyone may create files in ``/dev/shm``: a name is only taken as a segment when it is
    exactly what :meth:`SharedMemoryCollectives._ready` makes (a pid within the kernel's
    bound, a token of 16 hex digits), and it is removed only when it is a regular file this
    user owns (not followed if a link), so nothing another user planted is touched or
    believed."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    uid = os.getuid()
    for name in names:
        pid = _pid_of(name)
        if pid is None or alive(pid):
            continue
        path = SHM_DIR / name
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                os.unlink(path)
        except OSError:
            pass


def _pid_of(name: str) -> int | None:
    """The creating pid a segment's name carries, or None when it is not such a name."""
    match = _NAME.fullmatch(name)
    return None if match is None else parse_pid(match.group(1))


class SharedMemoryCollectives:
    """All-reduce and all-gather of float32 CPU tensors over the ranks of ``group``."""

    def __init__(self, group: dist.ProcessGroup | None, rank: int, size: int,
                 timeout: float) -> None:
        self.group, self.rank, self.size, self.timeout = group, rank, size, timeout
        self._c = _module()
        if size > self._c.MAX_RANKS:
            raise InputError(f"shared-memory collectives serve at most {self._c.MAX_RANKS} "
                             f"ranks, not {size}")
        self._map: mmap.mmap | None = None
        self._view: torch.Tensor | None = None  # holds the map's buffer while it is in use
        self._base = 0
        self._slot = 0
        self._pids: list[int] = []
        self._inbox: torch.Tensor | None = None

    def all_reduce(self, x: torch.Tensor) -> None:
        """Sum ``x`` (float32, CPU, contiguous) over the ranks, in place."""
        self._ready(x.numel() * 4)
        self._check(self._c.all_reduce(self._base, self.rank, self.size, self._slot,
                                       x.data_ptr(), x.numel(), self.timeout), "all-reduce")

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[N, S] per rank -> [size * N, S], rank-major, as ``all_gather_single``."""
        self._ready(x.numel() * 4)
        out = torch.empty(self.size * x.shape[0], *x.shape[1:], dtype=x.dtype)
        self._check(self._c.all_gather(self._base, self.rank, self.size, self._slot,
                                       x.data_ptr(), x.numel(), out.data_ptr(), self.timeout),
                    "all-gather")
        return out

    @property
    def ready(self) -> bool:
        """Whether the segment exists: from the group's first collective on, which every
        rank has made by the time it sends or takes the next message."""
        return self._map is not None

    def send(self, payload: bytes) -> None:
        """Rank 0: ``payload`` to every other rank (``receive``), in slot-sized rounds."""
        data = struct.pack("<q", len(payload)) + payload
        room = self._slot - 8
        for lo in range(0, len(data), room):
            part = torch.frombuffer(bytearray(data[lo:lo + room]), dtype=torch.uint8)
            self._broadcast(part, self.timeout)

    def receive(self) -> bytes:
        """Another rank: rank 0's next message, waited for as long as rank 0 lives (in
        bounded waits, so that Ctrl-C is seen between them)."""
        if self._inbox is None:
            self._inbox = torch.empty(self._slot, dtype=torch.uint8)
        parts: list[bytes] = []
        size = None
        while size is None or sum(map(len, parts)) < size + 8:
            count = self._broadcast(self._inbox, None)
            parts.append(self._inbox[:count].numpy().tobytes())
            if size is None:
                (size,) = struct.unpack_from("<q", parts[0])
        return b"".join(parts)[8:]

    def _broadcast(self, x: torch.Tensor, timeout: float | None) -> int:
        """One round of rank 0's message (``timeout`` None: look again until it comes)."""
        while True:
            got = self._c.broadcast(self._base, self.rank, self.size, self._slot,
                                    x.data_ptr(), x.numel(),
                                    _IDLE_LOOK_S if timeout is None else timeout)
            if isinstance(got, int):
                return got
            if timeout is not None or got[0] != "timeout":
                self._check(got, "message")

    def close(self) -> None:
        if self._map is not None:
            self._view = None
            self._map.close()
            self._map, self._base = None, 0

    def _check(self, outcome: tuple[str, int] | None, what: str) -> None:
        if outcome is None:
            return
        kind, rank = outcome
        pid = self._pids[rank] if rank < len(self._pids) else "?"
        if kind == "died":
            raise CollectiveError(f"rank {self.rank}: rank {rank} (pid {pid}) died during a "
                                  f"shared-memory {what}")
        raise CollectiveError(f"rank {self.rank}: rank {rank} (pid {pid}) did not reach a "
                              f"shared-memory {what} within {self.timeout:g} s "
                              "(INTERLOCK_TP_TIMEOUT sets the bound)")

    def _ready(self, nbytes: int) -> None:
        """Make the segment at the first collective (every rank calls this at the same one)."""
        if self._map is not None:
            return
        line = self._c.LINE
        slot = max(MIN_SLOT, (nbytes + 4095) // 4096 * 4096)
        slot = (slot + line - 1) // line * line
        size = self._c.HEADER + self.size * slot
        name = [""]
        path: Path | None = None
        try:
            if self.rank == 0:
                sweep()
                name[0] = f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
                path = SHM_DIR / name[0]
                # O_EXCL never opens what is already there (nor follows a link there).
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                try:
                    os.ftruncate(fd, size)
                    self._map = mmap.mmap(fd, size)
                finally:
                    os.close(fd)
            dist.broadcast_object_list(name, src=self._global(0), group=self.group)
            if self.rank != 0:
                self._map = _map_peer(name[0], size)
            assert self._map is not None
            offset = self.rank * self._c.RANK_STRIDE + self._c.PID_OFFSET
            struct.pack_into("<q", self._map, offset, os.getpid())
            dist.barrier(group=self.group)  # every rank has mapped it and written its pid
        finally:
            if path is not None:
                path.unlink(missing_ok=True)
        self._pids = [struct.unpack_from("<q", self._map, r * self._c.RANK_STRIDE
                                         + self._c.PID_OFFSET)[0] for r in range(self.size)]
        self._slot = slot
        self._view = torch.frombuffer(self._map, dtype=torch.uint8)
        self._base = self._view.data_ptr()

    def _global(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)


def _map_peer(name: str, size: int) -> mmap.mmap:
    """Map the segment rank 0 made: a regular file of this user, of the size agreed (the
    name is checked as :func:`sweep` checks it, and a link is not followed)."""
    if _pid_of(name) is None:
        raise CollectiveError(f"rank 0 named the shared segment {name!r}, not one of ours")
    fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != size:
            raise CollectiveError(
                f"{SHM_DIR / name}: not the {size}-byte segment rank 0 made (a file "
                f"of {st.st_size} bytes, owner uid {st.st_uid})"
            )
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
