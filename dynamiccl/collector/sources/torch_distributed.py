"""Per-collective timings from ``torch.distributed`` (any backend), streamed like the plugin.

One line in a training script::

    import dynamiccl.collector.sources.torch_distributed as d; d.enable()   # before the training loop

or no code change, with torchrun (each worker enables the source, then runs the script)::

    torchrun --nproc-per-node 4 -m dynamiccl.collector.sources.torch_distributed train.py --lr 3e-4

``enable()`` wraps the ``torch.distributed`` functions ``all_reduce``, ``all_gather``,
``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``, ``broadcast``,
``reduce``, ``all_to_all_single``, ``send``, ``recv``, ``isend``, ``irecv`` and ``barrier``
(call them as ``dist.all_reduce(...)``; a name imported with ``from torch.distributed import
all_reduce`` *before* ``enable()`` keeps the unwrapped function). Each call becomes one COLL or
P2P record in ``dynamiccl/collector/wire_format.py``'s layout: rank / nranks of its process group, the
group as a communicator (``comm_hash`` = 64-bit hash of the group's name and global ranks, the
same on every member; one COMM record names it ``world``, its ``group_desc`` or ``group<name>``),
func, datatype, count, bytes (per-rank message as NCCL counts it: AllGather the input,
ReduceScatter the output, AlltoAll the whole input), root / peer as a group rank, a per-(group,
func) ``seq_number`` (the same instance has the same number on every rank), and its timing:

* ``enqueue_ns`` = CLOCK_REALTIME when the call started, ``cpu_end_ns`` = when the operation
  completed, ``timing_source = KERNEL_CPU``, so the collector's duration is completion − call;
* blocking calls complete when they return;
* ``async_op=True`` / ``isend`` / ``irecv`` (``DYNAMICCL_TORCH_ASYNC_TIMING``):

  - ``wait`` (default): completion = the first moment the *application* sees the operation
    complete — ``Work.wait()`` returning (or raising), ``Work.is_completed()`` first returning
    True, or, if the caller takes ``Work.get_future()``, that future's completion. The duration
    is therefore the operation's latency as the training loop experiences it: exact (plus the
    thread wake-up) when the caller waits while the operation is still running — the usual
    launch-buckets-then-wait-in-order pattern — and an upper bound when the caller waits late
    (compute overlapped after the launch is counted in). The caller gets the backend's own
    Work: ``torch.distributed.Work``'s ``wait`` / ``is_completed`` / ``get_future`` are patched
    at class level while the source is enabled (one dict insert per call, one Python frame per
    wait; no callback, no extra thread). A Work dropped without being observed complete is
    sent untimed (``timing_source = NONE``) and counted stale (``events_stale``), at the latest
    when ``pending_cap`` (4096) newer ones are waiting or at ``disable()``;
  - ``callback``: the exact completion time from the Work's future done-callback where the
    backend gives Works a future (gloo and NCCL collectives), whenever the caller waits. The
    callback runs on the backend's thread and must take the GIL there, which costs the
    application 12–26 µs per call on a loaded 2-core machine (benchmark), against ~4 µs for
    ``wait``. gloo's send/recv Works have no future and fall back to ``wait`` timing;
* operations on non-CPU tensors are recorded with ``timing_source = NONE`` (counted, no latency):
  a host clock cannot see when device work finished — with NCCL use the profiler plugin;
* ``barrier`` has no func code of its own: it is an ``AllReduce`` record of 0 bytes (size bucket
  −1), the way NCCL-based barriers reach the plugin as a tiny all-reduce.

The application thread does a few attribute reads, two ``time.time_ns()`` and one ``deque``
append per call (async: one dict insert, and the append at wait) (``python benchmarks/torch_source_overhead.py``); the record encoding, the
socket and the reconnects are the :class:`~dynamiccl.collector.sources.wire_sender.WireSender` thread's.
A full queue drops and counts (STATS ``records_dropped_ring_full``), a collector that is down
costs nothing but ``records_undelivered``; a call this module cannot describe is passed through
unrecorded (``stats()["unrecorded"]``). Settings: the plugin's ``DYNAMICCL_COLLECTOR``,
``DYNAMICCL_HOST``, ``DYNAMICCL_JOB_ID``, ``DYNAMICCL_RING_SIZE`` (queue),
``DYNAMICCL_FLUSH_MS`` and ``DYNAMICCL_TORCH_ASYNC_TIMING`` (``wait`` | ``callback``).
"""

from __future__ import annotations

import atexit
import logging
import os
import runpy
import sys
import threading

from dynamiccl.collector.sources import torch_hooks
from dynamiccl.collector.sources.torch_hooks import WRAPPED
from dynamiccl.collector.sources.torch_recorder import ASYNC_TIMINGS, Recorder, TorchSourceConfig

__all__ = ["enable", "disable", "is_enabled", "stats", "TorchSourceConfig", "WRAPPED", "ASYNC_TIMINGS"]

log = logging.getLogger(__name__)

_enable_lock = threading.Lock()


def enable(collector: str | None = None, *, config: TorchSourceConfig | None = None,
           async_timing: str | None = None, **sender_overrides) -> Recorder:
    """Start the source (idempotent) and return it. ``collector`` overrides DYNAMICCL_COLLECTOR,
    ``async_timing`` DYNAMICCL_TORCH_ASYNC_TIMING; other keyword arguments override
    :class:`SenderConfig` fields (``host=``, ``job_id=``, ``queue_size=``, ``flush_ms=``).
    Raises ValueError for a malformed setting."""
    with _enable_lock:
        running = torch_hooks.active()
        if running is not None:
            return running
        import torch.distributed as dist
        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this torch build")
        if config is None:
            if collector is not None:
                sender_overrides["collector"] = collector
            config = TorchSourceConfig.from_env(async_timing=async_timing, **sender_overrides)
        rec = Recorder(config.validate(), dist)
        torch_hooks.install(dist)
        torch_hooks.activate(rec)
        rec.sender.start()
        log.info("dynamiccl torch source: streaming to %s", config.sender.collector)
        return rec


def disable(timeout: float = 0.5) -> None:
    """Restore the original functions, flush (≤ ``timeout`` s) and stop the sender thread."""
    with _enable_lock:
        rec = torch_hooks.active()
        torch_hooks.activate(None)
        torch_hooks.uninstall()
        if rec is not None:
            rec.flush_pending()
            rec.sender.close(timeout)


def is_enabled() -> bool:
    return torch_hooks.active() is not None


def stats() -> dict:
    """Counters of the running source (STATS fields + unrecorded/connected), {} if off."""
    rec = torch_hooks.active()
    return rec.stats() if rec is not None else {}


def _after_fork_in_child() -> None:
    # the sender thread does not survive fork(); a forked helper (DataLoader worker) records nothing
    torch_hooks.activate(None)


atexit.register(disable)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def main(argv: list[str] | None = None) -> int:
    """``python -m dynamiccl.collector.sources.torch_distributed SCRIPT [ARGS]`` or ``... -m MODULE [ARGS]``:
    enable the source, then run the training script as ``__main__`` (what torchrun's ``-m`` runs)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(main.__doc__, file=sys.stderr)
        return 2
    enable()
    if argv[0] == "-m":
        if len(argv) < 2:
            print("expected a module name after -m", file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    # run the imported module's main, so enable() state lives in dynamiccl.collector.sources.torch_distributed
    from dynamiccl.collector.sources.torch_distributed import main as _main
    sys.exit(_main())
