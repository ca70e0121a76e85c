"""Rank 0 of a tensor-parallel run, seen by the engine as one runner.

``load`` refuses a size the model cannot be split into (before any process starts),
then either spawns ranks 1..N-1 with torch.multiprocessing on this machine or, under
``torchrun``, adopts the group torchrun started, broadcasts the load order, and loads
rank 0's own shard through the runner the decision names. ``execute`` broadcasts the
step's batch and runs rank 0's shard of it; the other ranks run theirs in lockstep
(the model's collectives pair them up).

When anything fails — a worker raising, dying, or never joining — rank 0 names the
rank and its error (``TensorParallelError``), ends the workers and becomes unusable;
every collective is bounded by ``INTERLOCK_TP_TIMEOUT``, so nothing waits forever.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from interlock.core.errors import InterlockError
from interlock.plugins import load_import_path
from interlock.runners.contract import (
    Decision,
    KVCacheSpec,
    ModelSpec,
    Runner,
    RunnerOutput,
    RunnerReport,
    ScheduledBatch,
    TensorParallelReport,
)
from interlock.runners.model.sharding import plan_shards
from interlock.runners.parallel import messages
from interlock.runners.parallel.distributed import (
    LOOPBACK,
    Channel,
    ParallelSettings,
    Rendezvous,
    TensorParallelError,
    backend_for,
    connect_store,
    join_control,
    join_tensor_parallel,
    new_namespace,
    reported_error,
    set_threads,
)
from interlock.runners.parallel.group import SINGLE, TensorParallel, set_current
from interlock.runners.parallel.worker import INTERRUPTED, rank_device, spawned

#: How long rank 0 waits, after a collective failed, for the failing rank's own report.
_GRACE_S = 5.0


class TensorParallelRunner:
    """Implements ``runners.contract.Runner`` over ``size`` ranks of the runner ``factory``."""

    def __init__(self, factory: str, size: int, settings: ParallelSettings) -> None:
        self.factory = factory
        self.size = size
        #: Read where the run started (``ParallelSettings.of``); every rank gets it.
        self.settings = settings
        self.inner: Runner | None = None
        self.tp: TensorParallel = SINGLE
        self._rdzv: Rendezvous | None = None
        self._store: dist.Store | None = None
        self._group = _Group()
        self._model: ModelSpec | None = None
        self._failed: Exception | None = None
        # Ends the workers when this runner is closed, collected, or the process exits.
        self._closer = weakref.finalize(self, _shutdown, self._group)

    @property
    def worker_pids(self) -> tuple[int, ...]:
        """Process ids of the ranks this process spawned (none under torchrun)."""
        return tuple(p.pid for p in self._group.workers)

    def load(self, model: ModelSpec, kv_cache: KVCacheSpec, decision: Decision) -> None:
        if model.tensor_parallel_size != self.size:
            raise TensorParallelError(
                f"the model asks for tensor_parallel_size={model.tensor_parallel_size}, "
                f"this runner was made for {self.size}"
            )
        plan_shards(model.config, self.size)  # refused here, before any process starts
        device = torch.device(model.device)
        backend_for(device.type)
        self._model = model
        try:
            self._start()
            channel, rdzv = self._group.channel, self._rdzv
            assert channel is not None and rdzv is not None
            order = messages.load_message(model, kv_cache, decision, self.factory)
            channel.send(messages.encode(order))
            device = rank_device(model.device, rdzv.local_rank)
            set_threads(device, rdzv)
            self.tp = join_tensor_parallel(rdzv, device, self.settings.timeout_s, channel)
            set_current(self.tp)
            inner = load_import_path(self.factory)()
            inner.load(replace(model, device=str(device)), kv_cache, decision)
            self.inner = inner
        except BaseException as exc:
            raise self._fail(exc) from None

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        if self._failed is not None:
            raise self._failed
        channel = self._group.channel
        if self.inner is None or channel is None:
            raise TensorParallelError("execute() before load()")
        try:
            channel.send(messages.encode(messages.step_message(batch)))
            return self.inner.execute(batch)
        except BaseException as exc:
            raise self._fail(exc) from None

    def report(self) -> RunnerReport:
        if self.inner is None or self._rdzv is None or self._model is None:
            raise TensorParallelError("report() before load()")
        report = self.inner.report()
        config = self._model.config
        plan = plan_shards(config, self.size)
        return replace(
            report,
            tensor_parallel=TensorParallelReport(
                size=self.size,
                backend=backend_for(torch.device(report.device).type),
                launcher=self._rdzv.launcher,
                heads_per_rank=plan.num_heads,
                kv_heads_per_rank=plan.num_kv_heads,
                notes=plan.notes(config),
                collectives=self.tp.collectives,
            ),
        )

    def close(self) -> None:
        """Stop every rank (idempotent); the runner cannot execute afterwards."""
        self._closer()

    # -- starting the group ----------------------------------------------------------

    def _start(self) -> None:
        timeout = self.settings.timeout_s
        if dist.is_initialized():
            raise TensorParallelError(
                "this process already belongs to a torch.distributed group (another "
                "tensor-parallel LLM not closed?); close it (LLM.close) before starting another"
            )
        torchrun = Rendezvous.from_torchrun(self.settings)
        if torchrun is not None:
            if torchrun.world_size != self.size:
                raise TensorParallelError(
                    f"torchrun started {torchrun.world_size} processes (WORLD_SIZE) but "
                    f"tensor_parallel_size is {self.size}; they must be equal"
                )
            if torchrun.rank != 0:
                raise TensorParallelError(
                    f"this is rank {torchrun.rank}: only rank 0 runs the engine; the other "
                    "ranks serve (interlock.runners.parallel.worker.serve)"
                )
            self._rdzv = torchrun
        else:  # port 0: the store picks a free port, the workers are told which
            self._rdzv = Rendezvous(LOOPBACK, 0, 0, self.size, 0, self.size, True,
                                    "torch.multiprocessing", new_namespace(), self.settings)
        self._store = connect_store(self._rdzv, timeout)
        self._rdzv = replace(self._rdzv, port=self._store.port)
        if torchrun is None:
            with _sigint_ignored():
                self._spawn()
        self._group.channel = join_control(self._rdzv, self._store, timeout)

    def _spawn(self) -> None:
        assert self._rdzv is not None
        context = mp.get_context("spawn")
        for rank in range(1, self.size):
            rdzv = replace(self._rdzv, rank=rank, local_rank=rank, host_store=False)
            process = context.Process(
                target=spawned, args=(rdzv, os.getpid()), name=f"interlock-tp-rank{rank}",
                daemon=True,
            )
            process.start()
            self._group.workers.append(process)

    # -- failures ----------------------------------------------------------------------

    def _fail(self, error: BaseException) -> BaseException:
        """Name the rank at fault, stop every rank, and remember the failure."""
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            self._group.failed = True  # the workers may be mid-step: end them now
            self.close()
            return error
        culprit, code = self._culprit()
        self._group.failed = True
        if code == INTERRUPTED:  # a Ctrl-C reached that rank first: this is an interruption
            self.close()
            return KeyboardInterrupt()
        if culprit is None and isinstance(error, InterlockError):
            failure: Exception = error  # already says what is wrong (a bad value, a rank)
        elif culprit is None:
            failure = TensorParallelError(
                f"tensor-parallel rank 0 failed: {type(error).__name__}: {_brief(error)}"
            )
        else:
            failure = TensorParallelError(f"tensor-parallel {culprit}")
        self._failed = failure
        self.close()
        return failure

    def _culprit(self) -> tuple[str | None, int | None]:
        """('rank N ...', its exit status) for the first worker that reported an error or
        died, waiting a little for its report (a collective can fail before the failing
        rank wrote it); (None, None) when none did."""
        if self._rdzv is None or self._store is None:
            return None, None
        deadline = time.monotonic() + _GRACE_S
        while True:
            for rank in range(1, self.size):
                error = reported_error(self._store, self._rdzv, rank)
                if error is not None:
                    return f"rank {rank} failed: {error}", None
            for rank, process in enumerate(self._group.workers, start=1):
                code = process.exitcode
                if code is not None and code != 0:
                    return f"rank {rank} (pid {process.pid}) died: {_exit_reason(code)}", code
            if time.monotonic() > deadline:
                for rank, process in enumerate(self._group.workers, start=1):
                    if process.pid is not None and _stopped(process.pid):
                        return (
                            f"rank {rank} (pid {process.pid}) is stopped (SIGSTOP, or a "
                            "debugger) and did not take part", None,
                        )
                return None, None
            time.sleep(0.05)


@dataclass
class _Group:
    """What ``_shutdown`` ends: the spawned workers and the channel to every rank."""

    workers: list[Any] = field(default_factory=list)
    channel: Channel | None = None
    failed: bool = False  # then the workers are ended at once, not asked to stop


def _shutdown(group: _Group) -> None:
    """Tell the workers to stop, then end any that has not within a few seconds."""
    workers = group.workers
    if group.channel is not None and not group.failed and dist.is_initialized():
        try:
            group.channel.send(messages.encode({"op": messages.STOP}))
        except (RuntimeError, OSError, ValueError):
            pass
    deadline = time.monotonic() + (0.0 if group.failed else 5.0)
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(5.0)
    if dist.is_initialized():
        dist.destroy_process_group()
    set_current(SINGLE)




@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Workers start with Ctrl-C ignored (the disposition survives the exec of spawn) until
    they can stop cleanly; until then rank 0, which gets it too, ends them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stopped(pid: int) -> bool:
    """Is process ``pid`` stopped (state T or t in /proc; False where there is no /proc)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold spaces.
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] in ("T", "t")


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _brief(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
