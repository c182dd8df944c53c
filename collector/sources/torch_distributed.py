"""Per-collective timings from ``torch.distributed`` (any backend), streamed like the plugin.

One line in a training script::

    import collector.sources.torch_distributed as d; d.enable()   # before the training loop

or no code change, with torchrun (each worker enables the source, then runs the script)::

    torchrun --nproc-per-node 4 -m collector.sources.torch_distributed train.py --lr 3e-4

``enable()`` wraps the ``torch.distributed`` functions ``all_reduce``, ``all_gather``,
``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``, ``broadcast``,
``reduce``, ``all_to_all_single``, ``send``, ``recv``, ``isend``, ``irecv`` and ``barrier``
(call them as ``dist.all_reduce(...)``; a name imported with ``from torch.distributed import
all_reduce`` *before* ``enable()`` keeps the unwrapped function). Each call becomes one COLL or
P2P record in ``collector/wire_format.py``'s layout: rank / nranks of its process group, the
group as a communicator (``comm_hash`` = 64-bit hash of the group's name and global ranks, the
same on every member; one COMM record names it ``world``, its ``group_desc`` or ``group<name>``),
func, datatype, count, bytes (per-rank message as NCCL counts it: AllGather the input,
ReduceScatter the output, AlltoAll the whole input), root / peer as a group rank, a per-(group,
func) ``seq_number`` (the same instance has the same number on every rank), and its timing:

* ``enqueue_ns`` = CLOCK_REALTIME when the call started, ``cpu_end_ns`` = when the operation
  completed, ``timing_source = KERNEL_CPU``, so the collector's duration is completion − call;
* blocking calls complete when they return; ``async_op=True`` / ``isend`` / ``irecv`` complete
  when the Work does, through its future's done-callback where the backend gives Works a future
  (gloo and NCCL collectives: the exact completion time, whenever the caller waits). gloo's
  send/recv Works have no future and report ``is_completed()`` only once waited on, so those
  are returned wrapped and recorded when ``wait()`` returns (an upper bound on completion,
  exact when the caller waits before the data arrives); one dropped unwaited is sent untimed
  and counted stale;
* operations on non-CPU tensors are recorded with ``timing_source = NONE`` (counted, no latency):
  a host clock cannot see when device work finished — with NCCL use the profiler plugin;
* ``barrier`` has no func code of its own: it is an ``AllReduce`` record of 0 bytes (size bucket
  −1), the way NCCL-based barriers reach the plugin as a tiny all-reduce.

The application thread does a few attribute reads, two ``time.time_ns()`` and one ``deque``
append per call (``python benchmarks/torch_source_overhead.py``); the record encoding, the
socket and the reconnects are the :class:`~collector.sources.wire_sender.WireSender` thread's.
A full queue drops and counts (STATS ``records_dropped_ring_full``), a collector that is down
costs nothing but ``records_undelivered``; a call this module cannot describe is passed through
unrecorded (``stats()["unrecorded"]``). Settings: the plugin's ``DYNAMICCL_COLLECTOR``,
``DYNAMICCL_HOST``, ``DYNAMICCL_JOB_ID``, ``DYNAMICCL_RING_SIZE`` (queue) and
``DYNAMICCL_FLUSH_MS``.
"""
from __future__ import annotations

import atexit
import hashlib
import inspect
import logging
import os
import runpy
import sys
import threading
import time
from functools import partial
from dataclasses import dataclass, field

from collector.sources.wire_sender import Comm, SenderConfig, WireSender, _env_int
from collector.wire_format import DATATYPES, FUNCS, Kind, TimingSource, UNKNOWN

__all__ = ["enable", "disable", "is_enabled", "stats", "TorchSourceConfig", "WRAPPED"]

log = logging.getLogger(__name__)

_F = {name: i for i, name in enumerate(FUNCS)}
_D = {name: i for i, name in enumerate(DATATYPES)}
_CPU = TimingSource.KERNEL_CPU
_NONE = TimingSource.NONE

# name → (record kind, wire func, tensor parameter giving the bytes, peer parameters, always async)
_SPECS = {
    "all_reduce": (Kind.COLL, "AllReduce", "tensor", None, False),
    "all_gather": (Kind.COLL, "AllGather", "tensor", None, False),
    "all_gather_into_tensor": (Kind.COLL, "AllGather", "input_tensor", None, False),
    "reduce_scatter": (Kind.COLL, "ReduceScatter", "output", None, False),
    "reduce_scatter_tensor": (Kind.COLL, "ReduceScatter", "output", None, False),
    "broadcast": (Kind.COLL, "Broadcast", "tensor", ("src", "group_src"), False),
    "reduce": (Kind.COLL, "Reduce", "tensor", ("dst", "group_dst"), False),
    "all_to_all_single": (Kind.COLL, "AlltoAll", "input", None, False),
    "send": (Kind.P2P, "Send", "tensor", ("dst", "group_dst"), False),
    "recv": (Kind.P2P, "Recv", "tensor", ("src", "group_src"), False),
    "isend": (Kind.P2P, "Send", "tensor", ("dst", "group_dst"), True),
    "irecv": (Kind.P2P, "Recv", "tensor", ("src", "group_src"), True),
    "barrier": (Kind.COLL, "AllReduce", None, None, False),
}
#: the torch.distributed functions enable() wraps
WRAPPED = tuple(_SPECS)


@dataclass(frozen=True)
class TorchSourceConfig:
    sender: SenderConfig = field(default_factory=SenderConfig)

    @classmethod
    def from_env(cls, env=os.environ, **sender_overrides) -> "TorchSourceConfig":
        return cls(sender=SenderConfig.from_env(env, **sender_overrides)).validate()

    def validate(self) -> "TorchSourceConfig":
        self.sender.validate()
        return self


@dataclass(eq=False)
class _GroupComm(Comm):
    seq: list = field(default_factory=lambda: [0] * 16)  # next seq_number per func code
    g2l: dict = field(default_factory=dict)              # global rank → group rank


def _dtype_codes() -> dict:
    import torch
    names = {"float32": "ncclFloat32", "float16": "ncclFloat16", "bfloat16": "ncclBfloat16",
             "float64": "ncclFloat64", "int8": "ncclInt8", "uint8": "ncclUint8", "bool": "ncclUint8",
             "int32": "ncclInt32", "int64": "ncclInt64", "uint32": "ncclUint32",
             "uint64": "ncclUint64", "float8_e4m3fn": "ncclFloat8e4m3",
             "float8_e5m2": "ncclFloat8e5m2"}
    out = {}
    for tname, nccl in names.items():
        dt = getattr(torch, tname, None)
        if dt is not None:
            out[dt] = _D[nccl]
    return out


class _Recorder:
    """State of an enabled source: the sender, the communicator cache, the counters."""

    def __init__(self, config: TorchSourceConfig, dist):
        self.config = config
        self.dist = dist
        self.sender = WireSender(config.sender, stats_provider=self._extra_stats)
        self.queue = self.sender.queue
        self.capacity = self.sender.capacity
        self.dtypes = _dtype_codes()
        self.comms: dict = {}        # group object (None = default group) → _GroupComm or False
        self.no_future: set = set()  # (type(work), func) whose Work has no future
        self.unrecorded = 0
        self.stale = 0
        self._lock = threading.Lock()     # rare paths only (comm creation, counters)

    # -- communicators ---------------------------------------------------------------------------
    def comm_for(self, group):
        """Slow path, once per group: build the communicator (False: not a member / not ready)."""
        dist = self.dist
        with self._lock:
            hit = self.comms.get(group)
            if hit is not None:
                return hit
            from torch.distributed import distributed_c10d as c10d
            try:
                pg = group if group is not None else c10d._get_default_group()
                if pg is None or pg == c10d.GroupMember.NON_GROUP_MEMBER:
                    self.comms[group] = False
                    return False
                ranks = list(dist.get_process_group_ranks(pg))
                name = str(getattr(pg, "group_name", "") or c10d._get_process_group_name(pg))
                desc = str(getattr(pg, "group_desc", "") or "")
            except Exception as exc:  # not initialised yet, exotic group: pass through
                log.debug("dynamiccl torch source: cannot describe group %r: %s", group, exc)
                return False
            is_world = pg is c10d._get_default_group()
            digest = hashlib.blake2b(f"{name}|{','.join(map(str, ranks))}".encode(), digest_size=8)
            comm_hash = int.from_bytes(digest.digest(), "little") or 1
            label = "world" if is_world else (desc if desc and desc != "undefined" else f"group{name}")
            lws = _env_int(os.environ, "LOCAL_WORLD_SIZE", 0)
            nnodes = len({r // lws for r in ranks}) if lws > 0 else 0
            comm = _GroupComm(comm_hash=comm_hash, name=label, rank=int(pg.rank()), nranks=int(pg.size()),
                              nnodes=nnodes, g2l={g: i for i, g in enumerate(ranks)})
            self.comms[group] = comm
            if group is None:
                self.comms[pg] = comm
            self.sender.register_comm(comm)
            return comm

    def forget(self, group) -> None:
        with self._lock:
            if group is None:
                self.comms.clear()
            else:
                self.comms.pop(group, None)

    # -- async completion ------------------------------------------------------------------------
    def track(self, work, prefix: tuple, func: int, timing: int):
        """Arrange for the record to be emitted when ``work`` completes; returns what the caller
        gets back (``work`` itself, or a :class:`_TimedWork` around it)."""
        if timing == _NONE:  # device tensors: completion is not visible from the host
            self._emit(prefix + (0, _NONE))
            return work
        key = (type(work), func)
        if key not in self.no_future:
            try:
                fut = work.get_future()
            except Exception:  # "Work::getFuture not implemented" (gloo send/recv)
                self.no_future.add(key)
            else:
                fut.add_done_callback(partial(_on_done, self, prefix))
                return work
        return _timed_work(self, work, prefix)

    def _emit(self, item: tuple) -> None:
        if len(self.queue) < self.capacity:
            self.queue.append(item)
        else:
            self.sender.drop()

    def _extra_stats(self) -> dict:
        return {"events_stale": self.stale}

    def stats(self) -> dict:
        out = self.sender.counters()
        out.update(unrecorded=self.unrecorded, connected=self.sender.connected)
        return out


def _on_done(rec: _Recorder, prefix: tuple, _fut, time_ns=time.time_ns) -> None:
    """Future done-callback (runs on the backend's thread): as little as possible. A failed
    operation is recorded too, with its time to failure (the caller's wait() raises)."""
    q = rec.queue
    if len(q) < rec.capacity:
        q.append(prefix + (time_ns(), _CPU))
    else:
        rec.sender.drop()


_TIMED_WORK_CLS = None


def _timed_work(rec: _Recorder, work, prefix: tuple):
    """Wrap a Work that can tell its completion only through ``wait()`` (gloo send/recv: no
    future, ``is_completed()`` stays False until waited on)."""
    global _TIMED_WORK_CLS
    if _TIMED_WORK_CLS is None:
        _TIMED_WORK_CLS = _define_timed_work(rec.dist.Work)
    return _TIMED_WORK_CLS(rec, work, prefix)


def _define_timed_work(base):
    class _TimedWork(base):
        """The caller's Work, recorded when ``wait()`` returns: completion is then known to have
        happened by that time (an upper bound, exact when the caller waits before the data is
        there). A Work dropped without ``wait()`` is sent untimed and counted stale."""

        def __init__(self, rec, inner, prefix):
            super().__init__()
            self._rec, self._inner, self._prefix = rec, inner, prefix

        def _record(self, timing: int) -> None:
            rec, prefix = self._rec, self._prefix
            if prefix is None:
                return
            self._prefix = None
            if timing == _NONE:
                rec.stale += 1
                rec._emit(prefix + (0, _NONE))
            else:
                rec._emit(prefix + (time.time_ns(), _CPU))

        def wait(self, *args, **kwargs):
            out = self._inner.wait(*args, **kwargs)
            self._record(_CPU)
            return out

        def is_completed(self):
            return self._inner.is_completed()

        def is_success(self):
            return self._inner.is_success()

        def exception(self):
            return self._inner.exception()

        def source_rank(self):
            return self._inner.source_rank()

        def result(self):
            return self._inner.result()

        def synchronize(self):
            return self._inner.synchronize()

        def get_future(self):
            return self._inner.get_future()

        def __getattr__(self, name):  # anything else the Work API grows
            return getattr(self._inner, name)

        def __del__(self):
            try:
                self._record(_NONE)
            except Exception:  # pragma: no cover - interpreter shutdown
                pass

    return _TimedWork


_REC: _Recorder | None = None
_ORIGINALS: dict = {}
_enable_lock = threading.Lock()


def _param_index(params: list[str], name: str | None) -> int:
    if name is None or name not in params:
        return -1
    return params.index(name)


def _make_wrapper(orig, fname: str):
    kind, func_name, tname, peer, always_async = _SPECS[fname]
    func = _F[func_name]
    params = list(inspect.signature(orig).parameters)
    ti, gi = _param_index(params, tname), _param_index(params, "group")
    ai = _param_index(params, "async_op")
    pi = _param_index(params, peer[0]) if peer else -1
    qi = _param_index(params, peer[1]) if peer else -1
    pname, qname = (peer or (None, None))
    is_recv = fname in ("recv", "irecv")
    time_ns = time.time_ns

    def wrapper(*args, **kwargs):
        rec = _REC
        if rec is None:
            return orig(*args, **kwargs)
        n = len(args)
        try:
            group = args[gi] if n > gi else kwargs.get("group")
            comm = rec.comms.get(group)
            if comm is None:
                comm = rec.comm_for(group)
            if comm is False:
                return orig(*args, **kwargs)
            if ti >= 0:
                t = args[ti] if n > ti else kwargs[tname]
                count, nbytes = t.numel(), t.nbytes
                dtype = rec.dtypes.get(t.dtype, UNKNOWN)
                timing = _CPU if t.is_cpu else _NONE
            else:
                count = nbytes = 0
                dtype, timing = UNKNOWN, _CPU
            root = 0
            if pi >= 0:
                p = args[pi] if n > pi else kwargs.get(pname)
                if p is not None:
                    root = comm.g2l.get(p, -1)
                else:
                    q = args[qi] if qi >= 0 and n > qi else kwargs.get(qname)
                    root = -1 if q is None else q
            async_ = always_async or (ai >= 0 and (args[ai] if n > ai else kwargs.get("async_op", False)))
            seqs = comm.seq
            seq = seqs[func]
        except Exception:
            rec.unrecorded += 1
            return orig(*args, **kwargs)
        seqs[func] = seq + 1
        t0 = time_ns()
        out = orig(*args, **kwargs)
        t1 = time_ns()
        if async_:
            if out is not None:
                out = rec.track(out, (comm, kind, func, dtype, root, count, nbytes, seq, t0), func, timing)
            return out
        if is_recv and root == -1 and isinstance(out, int):
            root = comm.g2l.get(out, -1)  # recv from any source returns the sender's global rank
        item = (comm, kind, func, dtype, root, count, nbytes, seq, t0, t1, timing)
        q = rec.queue
        if len(q) < rec.capacity:
            q.append(item)
        else:
            rec.sender.drop()
        return out

    wrapper.__name__ = getattr(orig, "__name__", fname)
    wrapper.__qualname__ = getattr(orig, "__qualname__", fname)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__wrapped__ = orig
    wrapper._dynamiccl_wrapper = True
    return wrapper


def _make_destroy_wrapper(orig):
    def destroy_process_group(*args, **kwargs):
        rec = _REC
        out = orig(*args, **kwargs)
        if rec is not None:
            group = args[0] if args else kwargs.get("group")
            rec.forget(group)
        return out

    destroy_process_group.__wrapped__ = orig
    destroy_process_group.__doc__ = getattr(orig, "__doc__", None)
    return destroy_process_group


def enable(collector: str | None = None, *, config: TorchSourceConfig | None = None,
           **sender_overrides) -> "_Recorder":
    """Start the source (idempotent) and return it. ``collector`` overrides DYNAMICCL_COLLECTOR;
    other keyword arguments override :class:`SenderConfig` fields (``host=``, ``job_id=``,
    ``queue_size=``, ``flush_ms=``). Raises ValueError for a malformed setting."""
    global _REC
    with _enable_lock:
        if _REC is not None:
            return _REC
        import torch.distributed as dist
        if not dist.is_available():
            raise RuntimeError("torch.distributed is not available in this torch build")
        if config is None:
            if collector is not None:
                sender_overrides["collector"] = collector
            config = TorchSourceConfig.from_env(**sender_overrides)
        rec = _Recorder(config.validate(), dist)
        for name in WRAPPED:
            orig = getattr(dist, name, None)
            if orig is None or getattr(orig, "_dynamiccl_wrapper", False):
                continue
            _ORIGINALS[name] = orig
            setattr(dist, name, _make_wrapper(orig, name))
        _ORIGINALS["destroy_process_group"] = dist.destroy_process_group
        dist.destroy_process_group = _make_destroy_wrapper(dist.destroy_process_group)
        _REC = rec
        rec.sender.start()
        log.info("dynamiccl torch source: streaming to %s", config.sender.collector)
        return rec


def disable(timeout: float = 0.5) -> None:
    """Restore the original functions, flush (≤ ``timeout`` s) and stop the sender thread."""
    global _REC
    with _enable_lock:
        rec, _REC = _REC, None
        if _ORIGINALS:
            import torch.distributed as dist
            for name, orig in _ORIGINALS.items():
                setattr(dist, name, orig)
            _ORIGINALS.clear()
        if rec is not None:
            rec.sender.close(timeout)


def is_enabled() -> bool:
    return _REC is not None


def stats() -> dict:
    """Counters of the running source (STATS fields + unrecorded/connected), {} if off."""
    rec = _REC
    return rec.stats() if rec is not None else {}


def _after_fork_in_child() -> None:
    # the sender thread does not survive fork(); a forked helper (DataLoader worker) records nothing
    global _REC
    _REC = None


atexit.register(disable)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def main(argv: list[str] | None = None) -> int:
    """``python -m collector.sources.torch_distributed SCRIPT [ARGS]`` or ``... -m MODULE [ARGS]``:
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
    # run the imported module's main, so enable() state lives in collector.sources.torch_distributed
    from collector.sources.torch_distributed import main as _main
    sys.exit(_main())
