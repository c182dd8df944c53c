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
import hashlib
import inspect
import logging
import os
import runpy
import sys
import threading
import time
from functools import partial
from weakref import ref as _ref
from dataclasses import dataclass, field

from dynamiccl.collector.sources.wire_sender import Comm, SenderConfig, WireSender, _env_int
from dynamiccl.collector.wire_format import DATATYPES, FUNCS, Kind, TimingSource, UNKNOWN

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


#: how async operations are timed (``DYNAMICCL_TORCH_ASYNC_TIMING``; module docstring)
ASYNC_TIMINGS = ("wait", "callback")


@dataclass(frozen=True)
class TorchSourceConfig:
    sender: SenderConfig = field(default_factory=SenderConfig)
    async_timing: str = "wait"   # "wait": when the caller sees completion; "callback": the future's
    pending_cap: int = 4096      # async operations awaiting their wait() (oldest sent untimed past it)

    @classmethod
    def from_env(cls, env=os.environ, *, async_timing: str | None = None,
                 **sender_overrides) -> "TorchSourceConfig":
        timing = async_timing if async_timing is not None else env.get("DYNAMICCL_TORCH_ASYNC_TIMING", "wait")
        return cls(sender=SenderConfig.from_env(env, **sender_overrides), async_timing=timing).validate()

    def validate(self) -> "TorchSourceConfig":
        self.sender.validate()
        if self.async_timing not in ASYNC_TIMINGS:
            raise ValueError(f"DYNAMICCL_TORCH_ASYNC_TIMING / async_timing: expected one of "
                             f"{', '.join(ASYNC_TIMINGS)}, got {self.async_timing!r}")
        if not isinstance(self.pending_cap, int) or self.pending_cap < 1:
            raise ValueError(f"pending_cap must be an int >= 1, got {self.pending_cap!r}")
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
        self.callback_mode = config.async_timing == "callback"
        self.pending: dict = {}      # id(Work) → (weakref to it, record prefix) until observed complete
        self.pending_cap = config.pending_cap
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
        """Arrange for the record of an async operation to be emitted when it completes (see the
        module docstring); returns ``work`` itself."""
        if timing == _NONE:  # device tensors: completion is not visible from the host
            self._emit(prefix + (0, _NONE))
            return work
        if self.callback_mode:
            key = (type(work), func)
            if key not in self.no_future:
                try:
                    fut = _WORK_METHODS["get_future"](work)
                except Exception:  # "Work::getFuture not implemented" (gloo send/recv)
                    self.no_future.add(key)
                else:
                    fut.add_done_callback(partial(_on_done, self, prefix))
                    return work
        self.remember(work, prefix)
        return work

    def remember(self, work, prefix: tuple) -> None:
        """Park ``prefix`` until the application observes ``work`` complete (the patched
        ``Work.wait`` / ``is_completed`` / ``get_future``). Bounded: past ``pending_cap`` the
        oldest is sent untimed and counted stale."""
        try:
            wref = _ref(work)
        except TypeError:  # a Work type without weak references: not recordable
            self.unrecorded += 1
            return
        pending = self.pending
        k = id(work)
        old = pending.get(k)
        if old is not None:  # a dead Work's id reused: it was never waited on
            del pending[k]
            self._stale(old)
        elif len(pending) >= self.pending_cap:
            self._stale(pending.pop(next(iter(pending))))
        pending[k] = (wref, prefix)

    def observed(self, work) -> None:
        """The application saw ``work`` complete (or fail): emit its record, timed now."""
        entry = self.pending.pop(id(work), None)
        if entry is None:
            return
        t = time.time_ns()
        if entry[0]() is work:
            self._emit(entry[1] + (t, _CPU))
        else:
            self._stale(entry)

    def _stale(self, entry: tuple) -> None:
        self.stale += 1
        self._emit(entry[1] + (0, _NONE))

    def flush_pending(self) -> None:
        """At disable(): operations never observed complete are sent untimed (counted stale)."""
        while self.pending:
            try:
                self._stale(self.pending.popitem()[1])
            except KeyError:  # pragma: no cover - emptied by another thread
                break

    def _emit(self, item: tuple) -> None:
        if len(self.queue) < self.capacity:
            self.queue.append(item)
        else:
            self.sender.drop()

    def _extra_stats(self) -> dict:
        return {"events_stale": self.stale}

    def stats(self) -> dict:
        out = self.sender.counters()
        out.update(unrecorded=self.unrecorded, connected=self.sender.connected,
                   async_pending=len(self.pending))
        return out


def _on_done(rec: _Recorder, prefix: tuple, _fut, time_ns=time.time_ns) -> None:
    """Future done-callback (runs on the backend's thread, takes the GIL there): as little as
    possible. A failed operation is recorded too, with its time to failure."""
    q = rec.queue
    if len(q) < rec.capacity:
        q.append(prefix + (time_ns(), _CPU))
    else:
        rec.sender.drop()


# -- Work methods that observe completion ----------------------------------------------------------
# ``torch.distributed.Work`` is patched (class level, restored by disable()) rather than wrapped:
# the caller keeps the backend's own Work object (isinstance, C++ APIs taking it, identity), and
# the cost per async call is one dict insert plus one Python frame at wait().
_WORK_METHODS: dict = {}


def _patched_wait(self, *args, **kwargs):
    try:
        out = _WORK_METHODS["wait"](self, *args, **kwargs)
    except BaseException:
        rec = _REC
        if rec is not None and rec.pending:
            rec.observed(self)  # failed (or timed out): recorded with the time to failure
        raise
    rec = _REC
    if rec is not None and rec.pending and out is not False:
        rec.observed(self)
    return out


def _patched_is_completed(self):
    done = _WORK_METHODS["is_completed"](self)
    if done:
        rec = _REC
        if rec is not None and rec.pending:
            rec.observed(self)
    return done


def _patched_get_future(self):
    fut = _WORK_METHODS["get_future"](self)
    rec = _REC
    if rec is not None and rec.pending:
        entry = rec.pending.pop(id(self), None)
        if entry is not None:
            if entry[0]() is self:  # the caller waits on the future: time the completion itself
                fut.add_done_callback(partial(_on_done, rec, entry[1]))
            else:
                rec._stale(entry)
    return fut


_PATCHES = {"wait": _patched_wait, "is_completed": _patched_is_completed, "get_future": _patched_get_future}


def _patch_work(dist) -> None:
    cls = dist.Work
    for name, fn in _PATCHES.items():
        _WORK_METHODS[name] = getattr(cls, name)
        fn.__doc__ = getattr(_WORK_METHODS[name], "__doc__", None)
        setattr(cls, name, fn)


def _unpatch_work(dist) -> None:
    cls = dist.Work
    for name, orig in _WORK_METHODS.items():
        if cls.__dict__.get(name) is _PATCHES[name]:
            setattr(cls, name, orig)
    _WORK_METHODS.clear()


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
                prefix = (comm, kind, func, dtype, root, count, nbytes, seq, t0)
                if timing == _CPU and not rec.callback_mode:
                    rec.remember(out, prefix)  # timed when the caller sees it complete
                else:
                    rec.track(out, prefix, func, timing)
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
           async_timing: str | None = None, **sender_overrides) -> "_Recorder":
    """Start the source (idempotent) and return it. ``collector`` overrides DYNAMICCL_COLLECTOR,
    ``async_timing`` DYNAMICCL_TORCH_ASYNC_TIMING; other keyword arguments override
    :class:`SenderConfig` fields (``host=``, ``job_id=``, ``queue_size=``, ``flush_ms=``).
    Raises ValueError for a malformed setting."""
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
            config = TorchSourceConfig.from_env(async_timing=async_timing, **sender_overrides)
        rec = _Recorder(config.validate(), dist)
        for name in WRAPPED:
            orig = getattr(dist, name, None)
            if orig is None or getattr(orig, "_dynamiccl_wrapper", False):
                continue
            _ORIGINALS[name] = orig
            setattr(dist, name, _make_wrapper(orig, name))
        _ORIGINALS["destroy_process_group"] = dist.destroy_process_group
        dist.destroy_process_group = _make_destroy_wrapper(dist.destroy_process_group)
        _patch_work(dist)
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
            _unpatch_work(dist)
        if rec is not None:
            rec.flush_pending()
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
