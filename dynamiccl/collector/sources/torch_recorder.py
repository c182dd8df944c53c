"""The state of an enabled torch source: its sender, communicators, counters and async completions.

:class:`Recorder` turns a process group into a communicator (once per group: ``comm_hash`` = 64-bit hash
of the group's name and global ranks, the same on every member) and times asynchronous operations
(``async_timing``): ``wait`` parks a Work until the application sees it complete through the patched
``Work`` methods (:mod:`.torch_hooks`), bounded by ``pending_cap``; ``callback`` uses the Work's future
done-callback where the backend gives one. The hot path (:func:`.torch_hooks.make_wrapper`) reads
``queue``, ``capacity``, ``comms``, ``dtypes`` and ``callback_mode`` directly.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from weakref import ref as _ref

from dynamiccl.collector.sources.sender_config import env_int
from dynamiccl.collector.sources.wire_sender import Comm, SenderConfig, WireSender
from dynamiccl.collector.wire_format import DATATYPES, TimingSource

__all__ = ["ASYNC_TIMINGS", "TorchSourceConfig", "Recorder", "GroupComm", "WORK_METHODS", "on_done"]

log = logging.getLogger("dynamiccl.collector.sources.torch_distributed")

_D = {name: i for i, name in enumerate(DATATYPES)}
_CPU = TimingSource.KERNEL_CPU
_NONE = TimingSource.NONE

#: ``torch.distributed.Work``'s own ``wait`` / ``is_completed`` / ``get_future`` while they are patched
#: (filled and cleared by :mod:`.torch_hooks`; never rebound, so importers share it)
WORK_METHODS: dict = {}

#: how async operations are timed (``DYNAMICCL_TORCH_ASYNC_TIMING``; see :mod:`.torch_distributed`)
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
class GroupComm(Comm):
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


class Recorder:
    """State of an enabled source: the sender, the communicator cache, the counters."""

    def __init__(self, config: TorchSourceConfig, dist):
        self.config = config
        self.dist = dist
        self.sender = WireSender(config.sender, stats_provider=self._extra_stats)
        self.queue = self.sender.queue
        self.capacity = self.sender.capacity
        self.dtypes = _dtype_codes()
        self.comms: dict = {}        # group object (None = default group) → GroupComm or False
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
            lws = env_int(os.environ, "LOCAL_WORLD_SIZE", 0)
            nnodes = len({r // lws for r in ranks}) if lws > 0 else 0
            comm = GroupComm(comm_hash=comm_hash, name=label, rank=int(pg.rank()), nranks=int(pg.size()),
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
                    fut = WORK_METHODS["get_future"](work)
                except Exception:  # "Work::getFuture not implemented" (gloo send/recv)
                    self.no_future.add(key)
                else:
                    fut.add_done_callback(partial(on_done, self, prefix))
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


def on_done(rec: Recorder, prefix: tuple, _fut, time_ns=time.time_ns) -> None:
    """Future done-callback (runs on the backend's thread, takes the GIL there): as little as
    possible. A failed operation is recorded too, with its time to failure."""
    q = rec.queue
    if len(q) < rec.capacity:
        q.append(prefix + (time_ns(), _CPU))
    else:
        rec.sender.drop()
