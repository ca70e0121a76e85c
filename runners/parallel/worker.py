"""The worker entry point: one rank other than 0, spawned by rank 0 or started by torchrun.

It joins the group, loads its shard as rank 0's load order says, then executes every
step rank 0 broadcasts until told to stop. Its sampled tokens equal rank 0's (every
rank samples the same gathered logits with the same seeds); rank 0 alone returns them.
An error is left in the rendezvous store for rank 0 to name, and ends the process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import torch
import torch.distributed as dist

from interlock.core.heap import give_back_free_memory
from interlock.kernels import REGISTRY
from interlock.plugins import load_import_path
from interlock.plugins.kernels import install_plugin_kernels
from interlock.runners.contract import ModelSpec
from interlock.runners.model.checkpoint import resolve_model
from interlock.runners.parallel import messages
from interlock.runners.parallel.distributed import (
    Rendezvous,
    TensorParallelError,
    connect_store,
    join_control,
    join_tensor_parallel,
    report_error,
    set_threads,
    summary,
)
from interlock.runners.parallel.group import set_current

#: Exit status of a worker stopped by Ctrl-C (SIGINT), as a shell reports it.
INTERRUPTED = 130


def rank_device(device: str, local_rank: int) -> torch.device:
    """The device of a rank: its own GPU (by local rank) when the run is on GPUs."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(kind)


def serve(rdzv: Rendezvous) -> int:
    """Run rank ``rdzv.rank`` until rank 0 stops the group; the process's exit status."""
    store = None
    try:
        timeout = rdzv.settings.timeout_s
        store = connect_store(rdzv, timeout)
        channel = join_control(rdzv, store, timeout)
        message = messages.decode(channel.receive())
        if message["op"] == messages.STOP:
            return 0
        fields, kv_cache, decision, factory = messages.load_parts(message)
        device = rank_device(fields["device"], rdzv.local_rank)
        set_threads(device, rdzv)
        tp = join_tensor_parallel(rdzv, device, timeout, channel)
        if tp.size != fields["tensor_parallel_size"]:
            raise TensorParallelError(
                f"the group has {tp.size} ranks but rank 0 asks for tensor_parallel_size="
                f"{fields['tensor_parallel_size']}"
            )
        set_current(tp)
        # As on rank 0 (interlock.llm): plugin kernels join the registry before any runner
        # builds its kernel table; rank 0 already logged any that failed to install.
        install_plugin_kernels(REGISTRY)
        config = resolve_model(fields["name"]).config
        spec = ModelSpec(config=config, **{**fields, "device": str(device)})
        runner = load_import_path(factory)()
        runner.load(spec, kv_cache, decision)
        give_back_free_memory()  # the load's garbage, as rank 0's LLM does (core.heap)
        while (message := messages.decode(channel.receive()))["op"] == messages.STEP:
            runner.execute(messages.step_batch(message))
        return 0
    except KeyboardInterrupt:
        return INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to rank 0
        report_error(store, rdzv, exc)
        print(f"interlock tensor-parallel rank {rdzv.rank}: {summary(exc)}", file=sys.stderr)
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawned(rdzv: Rendezvous, parent: int) -> None:
    """Entry of a worker that rank 0 spawned with torch.multiprocessing (started with Ctrl-C
    ignored: from here on it stops the worker cleanly)."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(serve(rdzv))


def _die_with_parent(parent: int) -> None:
    """On Linux the kernel kills this worker when rank 0's process ends, however it ends,
    so no worker outlives it."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # rank 0 ended before the request took effect
        os._exit(1)
