"""Shared-memory TP segments, third hostile pass (issue 38, item 6): files any local user can
plant in /dev/shm under the segments' prefix are parsed with bounds, never believed, and
never removed unless they are this user's; a real TP=2 run goes through them."""

from __future__ import annotations

import os
import re
import socket
import stat
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from interlock.runners.parallel import shm

pytestmark = pytest.mark.skipif(shm.unavailable() is not None,
                                reason=f"shared memory: {shm.unavailable()}")


def _dead_pid() -> int:
    dead = mp.get_context("spawn").Process(target=time.sleep, args=(0,))
    dead.start()
    dead.join()
    assert dead.pid is not None
    return dead.pid


def _plant(tmp_path: Path) -> tuple[dict[str, Path], Path, Path]:
    """The planted files (name -> path) a sweep must leave, the victim a link points at, and
    a stale segment of this user's that it must remove."""
    dead = _dead_pid()
    victim = tmp_path / "victim"
    victim.write_text("mine")
    token = os.urandom(8).hex()
    keep = {
        "overflowing pid": shm.SHM_DIR / f"{shm.PREFIX}99999999999-ab",
        "pid past the kernel's bound": shm.SHM_DIR / f"{shm.PREFIX}{(1 << 22) + 1}-{token}",
        "pid 0 (the process group)": shm.SHM_DIR / f"{shm.PREFIX}0-{token}",
        "short token": shm.SHM_DIR / f"{shm.PREFIX}{dead}-ab",
        "a link": shm.SHM_DIR / f"{shm.PREFIX}{dead}-{os.urandom(8).hex()}",
        "a FIFO": shm.SHM_DIR / f"{shm.PREFIX}{dead}-{os.urandom(8).hex()}",
    }
    for what, path in keep.items():
        if what == "a link":
            os.symlink(victim, path)
        elif what == "a FIFO":
            os.mkfifo(path)
        else:
            path.write_bytes(b"x")
    if os.getuid() == 0:  # a stale-looking segment of another user
        other = shm.SHM_DIR / f"{shm.PREFIX}{dead}-{os.urandom(8).hex()}"
        other.write_bytes(b"x")
        os.chown(other, 65534, 65534)
        keep["another user's"] = other
    stale = shm.SHM_DIR / f"{shm.PREFIX}{dead}-{os.urandom(8).hex()}"
    stale.write_bytes(b"x")
    return keep, victim, stale


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if os.path.lexists(path):
            os.unlink(path)


def test_6_the_sweep_parses_bounds_and_removes_only_its_own(tmp_path: Path) -> None:
    keep, victim, stale = _plant(tmp_path)
    try:
        shm.sweep()
        assert not stale.exists()
        assert [w for w, p in keep.items() if not os.path.lexists(p)] == []
        assert victim.read_text() == "mine"
    finally:
        _remove([*keep.values(), stale])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, out: dict) -> None:
    torch.set_num_threads(1)
    created: list[tuple[str, int]] = []
    if rank == 0:  # what rank 0 creates: its name and mode, seen as it is made
        real_open = os.open

        def watching_open(path, flags, mode=0o777, *args, **kwargs):  # type: ignore[no-untyped-def]
            fd = real_open(path, flags, mode, *args, **kwargs)
            if flags & os.O_CREAT:
                created.append((os.path.basename(path), stat.S_IMODE(os.fstat(fd).st_mode)))
            return fd

        os.open = watching_open  # type: ignore[assignment]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    fast = shm.SharedMemoryCollectives(None, rank, 2, timeout=20.0)
    x = torch.full((8,), float(rank + 1))
    fast.all_reduce(x)
    out[rank] = (bool(torch.equal(x, torch.full((8,), 3.0))), created)
    fast.close()
    dist.destroy_process_group()


@pytest.mark.slow  # two ranks in fresh interpreters
def test_6_a_tp2_run_goes_through_planted_files(tmp_path: Path) -> None:
    keep, victim, stale = _plant(tmp_path)
    try:
        out = mp.get_context("spawn").Manager().dict()
        mp.start_processes(_rank, args=(_port(), out), nprocs=2, start_method="spawn")
        (ok0, created), (ok1, _) = out[0], out[1]
        assert ok0 and ok1
        ((name, mode),) = created
        assert mode == 0o600
        assert re.fullmatch(rf"{shm.PREFIX}[1-9][0-9]*-[0-9a-f]{{16}}", name)
        assert name.split("-")[-1] not in {p.name.split("-")[-1] for p in keep.values()}
        assert not os.path.lexists(shm.SHM_DIR / name)  # unlinked once every rank mapped it
        assert not stale.exists()
        assert [w for w, p in keep.items() if not os.path.lexists(p)] == []
        assert victim.read_text() == "mine"
    finally:
        _remove([*keep.values(), stale])


@pytest.mark.parametrize("text", ["99999999999", "0", "00042", "-5", "+5", "4194305",
                                  "\u0661\u0662", " 12", "1e3", ""])
def test_6_pids_read_from_names_are_parsed_with_bounds(text: str) -> None:
    from interlock.core.processes import parse_pid

    assert parse_pid(text) is None


def test_6_a_pid_within_bounds_is_read() -> None:
    from interlock.core.processes import MAX_PID, parse_pid

    assert parse_pid("42") == 42
    assert parse_pid(str(MAX_PID)) == MAX_PID
