"""Match the calls a rank issued (its worker log) to the profiler records of that rank's process.

A call's records are the rank's records whose ``enqueue_ns`` falls between the call's wall-clock
time and the next call's: the worker reads ``time.time_ns()`` (CLOCK_REALTIME, like the plugin's
``enqueue_ns``) before it enqueues, and waits for each call to finish before the next. Standard library and numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS, EventFlags, Kind, TimingSource

__all__ = ["CallRecords", "match_calls", "record_choice", "COLL_FUNCS"]

COLL_FUNCS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast")


@dataclass
class CallRecords:
    rank: int
    phase: str
    func: str
    nbytes: int
    cuda_us: float          # CUDA events: NCCL's stream when torch timed it, else the current stream
    records: np.ndarray     # EVENT_DTYPE rows of this call on this rank

    @property
    def _self(self) -> np.ndarray:
        """Send/recv to self: NCCL runs no proxy op and emits no KernelCh for them (no GPU timing)."""
        r = self.records
        return (r["kind"] == Kind.P2P) & (r["root"] == r["rank"])

    @property
    def complete(self) -> bool:
        r, own = self.records, self._self
        timed = ((r["timing_source"] == TimingSource.KERNEL_GPU) & (r["gpu_start_ns"] > 0)
                 & (r["gpu_end_ns"] >= r["gpu_start_ns"]))
        flagged = (r["flags"] & EventFlags.TIMING_SUSPECT) != 0     # the plugin refused a wrong GPU time
        api = (r["flags"] & EventFlags.API_LEVEL) != 0              # NCCL ran it with no Coll event (2.29+ Broadcast)
        return bool(len(r)) and bool(np.all(((r["flags"] & EventFlags.STALE) == 0) & (timed | own | flagged | api)))

    @property
    def suspect(self) -> bool:
        return bool(np.any((self.records["flags"] & EventFlags.TIMING_SUSPECT) != 0))

    @property
    def gpu_us(self) -> float:
        r = self.records[~self._self]
        if not len(r) or self.suspect or np.any((r["flags"] & EventFlags.API_LEVEL) != 0):
            return float("nan")
        return float(int(r["gpu_end_ns"].max()) - int(r["gpu_start_ns"].min())) / 1e3

    def expected(self, nranks: int) -> tuple[bool, str]:
        """Whether the records are what one such call must produce, with a reason when not."""
        funcs = [FUNCS[f] if f < len(FUNCS) else "?" for f in self.records["func"].tolist()]
        if self.func in COLL_FUNCS:
            ok = funcs == [self.func] and int(self.records["bytes"][0]) == self.nbytes
            return ok, "" if ok else f"expected one {self.func} record of {self.nbytes} B, got {funcs}"
        p2p = int(np.sum(self.records["kind"] == Kind.P2P))
        if self.func == "AlltoAll":
            if funcs == ["AlltoAll"]:
                return True, ""
            ok = p2p == len(funcs) and 2 * (nranks - 1) <= p2p <= 2 * nranks
            return ok, "" if ok else f"expected one AlltoAll or 2x{nranks - 1}..2x{nranks} P2P records, got {funcs}"
        ok = sorted(funcs) == ["Recv", "Send"]
        return ok, "" if ok else f"expected one Send and one Recv record, got {funcs}"


def match_calls(result: dict, events: np.ndarray, phases: tuple[str, ...]) -> list[CallRecords]:
    """The calls of one rank's worker ``result`` in ``phases``, each with its records."""
    cols = result["cols"]
    ix = {c: i for i, c in enumerate(cols)}
    mine = events[events["pid"] == result["pid"]]
    mine = mine[np.argsort(mine["enqueue_ns"], kind="stable")]
    t = mine["enqueue_ns"].astype(np.int64)
    calls = result["calls"]
    # a phase's end also ends its last call's interval (the next phase may start with untimed calls)
    ends = np.sort(np.array([v for k, v in result["marks"].items() if k.endswith("_end_ns")], np.int64))
    out: list[CallRecords] = []
    for i, c in enumerate(calls):
        if c[ix["phase"]] not in phases:
            continue
        lo = int(c[ix["t_ns"]])
        hi = int(calls[i + 1][ix["t_ns"]]) if i + 1 < len(calls) else np.iinfo(np.int64).max
        later = ends[ends > lo]
        hi = min(hi, int(later[0]) + 1) if len(later) else hi
        sel = mine[(t >= lo) & (t < hi)]
        cuda = c[ix["nccl_us"]] if c[ix["nccl_us"]] is not None else c[ix["cuda_us"]]
        out.append(CallRecords(result["rank"], c[ix["phase"]], c[ix["func"]], int(c[ix["bytes"]]),
                               float(cuda), sel))
    return out


def record_choice(rec: np.void | np.ndarray) -> tuple[str, str, int]:
    """(algorithm, protocol, channels) of one COLL record as names."""
    a, p = int(rec["algo"]), int(rec["proto"])
    return (ALGOS[a] if a < len(ALGOS) else "?", PROTOS[p] if p < len(PROTOS) else "?", int(rec["n_channels"]))
