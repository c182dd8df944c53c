"""What :func:`~dynamiccl.collector.sources.torch_distributed.enable` installs into ``torch.distributed``.

One wrapper per collective / P2P function (:data:`WRAPPED`), built once from the function's signature so a
call costs a few attribute reads, two ``time.time_ns()`` and one ``deque`` append; a wrapper around
``destroy_process_group`` that forgets the group's communicator; and class-level patches of
``torch.distributed.Work``'s ``wait`` / ``is_completed`` / ``get_future`` that time async operations when the
application sees them complete. Every hook reads the active recorder from :data:`_REC` (None: pass through).
"""
from __future__ import annotations

import inspect
import time
from functools import partial

from dynamiccl.collector.sources.torch_recorder import WORK_METHODS, Recorder, on_done
from dynamiccl.collector.wire_format import FUNCS, Kind, TimingSource, UNKNOWN

__all__ = ["WRAPPED", "install", "uninstall", "activate", "active", "make_wrapper"]

_F = {name: i for i, name in enumerate(FUNCS)}
_CPU = TimingSource.KERNEL_CPU
_NONE = TimingSource.NONE

# name → (record kind, wire func, tensor parameter giving the bytes, peer parameters, always async)
SPECS = {
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
WRAPPED = tuple(SPECS)

#: the recorder every hook reports to; None while the source is off (or in a forked child)
_REC: Recorder | None = None


def activate(rec: Recorder | None) -> None:
    global _REC
    _REC = rec


def active() -> Recorder | None:
    return _REC


# -- Work methods that observe completion ----------------------------------------------------------
# ``torch.distributed.Work`` is patched (class level, restored by disable()) rather than wrapped:
# the caller keeps the backend's own Work object (isinstance, C++ APIs taking it, identity), and
# the cost per async call is one dict insert plus one Python frame at wait().


def _patched_wait(self, *args, **kwargs):
    try:
        out = WORK_METHODS["wait"](self, *args, **kwargs)
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
    done = WORK_METHODS["is_completed"](self)
    if done:
        rec = _REC
        if rec is not None and rec.pending:
            rec.observed(self)
    return done


def _patched_get_future(self):
    fut = WORK_METHODS["get_future"](self)
    rec = _REC
    if rec is not None and rec.pending:
        entry = rec.pending.pop(id(self), None)
        if entry is not None:
            if entry[0]() is self:  # the caller waits on the future: time the completion itself
                fut.add_done_callback(partial(on_done, rec, entry[1]))
            else:
                rec._stale(entry)
    return fut


_PATCHES = {"wait": _patched_wait, "is_completed": _patched_is_completed, "get_future": _patched_get_future}


def _patch_work(dist) -> None:
    cls = dist.Work
    for name, fn in _PATCHES.items():
        WORK_METHODS[name] = getattr(cls, name)
        fn.__doc__ = getattr(WORK_METHODS[name], "__doc__", None)
        setattr(cls, name, fn)


def _unpatch_work(dist) -> None:
    cls = dist.Work
    for name, orig in WORK_METHODS.items():
        if cls.__dict__.get(name) is _PATCHES[name]:
            setattr(cls, name, orig)
    WORK_METHODS.clear()

def _param_index(params: list[str], name: str | None) -> int:
    if name is None or name not in params:
        return -1
    return params.index(name)


def _call_layout(orig, fname: str) -> tuple:
    """What the wrapper of ``orig`` (the torch.distributed function ``fname``) records and where it
    finds its arguments: (kind, func code, tensor parameter, peer parameter names, always async,
    receives, positions of the tensor, group, async_op and peer parameters, -1 if absent).
    Resolved once per wrapped function, so a call only indexes ``args``."""
    kind, func_name, tname, peer, always_async = SPECS[fname]
    params = list(inspect.signature(orig).parameters)
    ti, gi = _param_index(params, tname), _param_index(params, "group")
    ai = _param_index(params, "async_op")
    pi = _param_index(params, peer[0]) if peer else -1
    qi = _param_index(params, peer[1]) if peer else -1
    pname, qname = (peer or (None, None))
    is_recv = fname in ("recv", "irecv")
    return kind, _F[func_name], tname, pname, qname, always_async, is_recv, ti, gi, ai, pi, qi


def _dress(wrapper, orig, fname: str):
    """``wrapper`` looks like ``orig`` (name, qualname, doc, ``__wrapped__``) and is marked ours
    (``_dynamiccl_wrapper``: `install` never wraps a wrapper twice)."""
    wrapper.__name__ = getattr(orig, "__name__", fname)
    wrapper.__qualname__ = getattr(orig, "__qualname__", fname)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__wrapped__ = orig
    wrapper._dynamiccl_wrapper = True
    return wrapper


def make_wrapper(orig, fname: str):
    """The recording wrapper of ``orig``. Its body is the training job's hot path: one closure with
    everything resolved beforehand (`_call_layout`, ``time_ns`` bound), no call of ours per
    collective besides the recorder's dict look-ups and the queue append."""
    kind, func, tname, pname, qname, always_async, is_recv, ti, gi, ai, pi, qi = _call_layout(orig, fname)
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

    return _dress(wrapper, orig, fname)


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


_ORIGINALS: dict = {}


def install(dist) -> None:
    """Wrap :data:`WRAPPED` and ``destroy_process_group`` in ``dist`` and patch its ``Work``."""
    for name in WRAPPED:
        orig = getattr(dist, name, None)
        if orig is None or getattr(orig, "_dynamiccl_wrapper", False):
            continue
        _ORIGINALS[name] = orig
        setattr(dist, name, make_wrapper(orig, name))
    _ORIGINALS["destroy_process_group"] = dist.destroy_process_group
    dist.destroy_process_group = _make_destroy_wrapper(dist.destroy_process_group)
    _patch_work(dist)


def uninstall() -> None:
    """Restore what :func:`install` replaced (nothing when it did not run)."""
    if not _ORIGINALS:
        return
    import torch.distributed as dist
    for name, orig in _ORIGINALS.items():
        setattr(dist, name, orig)
    _ORIGINALS.clear()
    _unpatch_work(dist)
