"""The simulator engine's schedule as records (`dynamiccl.harness.simulator.engine.Engine._compile`): one
per (schedule slot, communicator of its group, rank), in schedule order."""
from __future__ import annotations

import dataclasses

from dynamiccl.collector.wire_format import FUNCS as WIRE_FUNCS
from dynamiccl.harness.simulator.engine_types import EMU_F_CROSS_NODE

__all__ = ["_Records", "_schedule_records", "_SEND", "_RECV"]

_SEND, _RECV = WIRE_FUNCS.index("Send"), WIRE_FUNCS.index("Recv")


@dataclasses.dataclass
class _Records:
    """The schedule's records in schedule order (`Engine._compile`)."""
    uniq: dict = dataclasses.field(default_factory=dict)          # (group, func, base bytes) -> unique op
    slot_u: list = dataclasses.field(default_factory=list)        # per schedule slot: its unique op, group, compute gap
    slot_g: list = dataclasses.field(default_factory=list)
    gap: list = dataclasses.field(default_factory=list)
    rec_lo: list = dataclasses.field(default_factory=list)        # per slot: its first record and instance
    inst_lo: list = dataclasses.field(default_factory=list)
    pair_count: dict = dataclasses.field(default_factory=dict)    # (comm, func) pair -> instances so far
    rank: list = dataclasses.field(default_factory=list)          # per record
    comm: list = dataclasses.field(default_factory=list)
    cpos: list = dataclasses.field(default_factory=list)
    slot: list = dataclasses.field(default_factory=list)
    func: list = dataclasses.field(default_factory=list)
    root: list = dataclasses.field(default_factory=list)
    flags: list = dataclasses.field(default_factory=list)
    node: list = dataclasses.field(default_factory=list)
    pair: list = dataclasses.field(default_factory=list)
    off: list = dataclasses.field(default_factory=list)
    n_rec: int = 0
    n_inst: int = 0


def _schedule_records(w, ppn: int) -> _Records:
    """One record per (schedule slot, communicator of its group, rank), with its (comm, func) pair's
    instance offset; Send ops become a Send and a Recv record whose root is the peer."""
    cid = {c.name: i for i, c in enumerate(w.comms)}
    r = _Records()
    pairs: dict[tuple[int, str], int] = {}
    for i, op in enumerate(w.schedule):
        g = w.group_id(op.group)
        r.slot_u.append(r.uniq.setdefault((g, op.func, op.bytes), len(r.uniq)))
        r.slot_g.append(g)
        r.gap.append(op.compute_us)
        r.rec_lo.append(r.n_rec)
        r.inst_lo.append(r.n_inst)
        for cpos, c in enumerate(w.groups[g].comms):
            ci = cid[c.name]
            p = pairs.setdefault((ci, op.func), len(pairs))
            off = r.pair_count.get(p, 0)
            r.pair_count[p] = off + 1
            for m, rank in enumerate(c.ranks):
                r.rank.append(rank)
                r.comm.append(ci)
                r.cpos.append(cpos)
                r.slot.append(i)
                r.node.append(rank // ppn)
                r.pair.append(p)
                r.off.append(off)
                if op.func == "Send":
                    r.func.append(_SEND if m == op.src else _RECV)
                    r.root.append(1 - m)              # the peer's rank in the 2-rank comm
                else:
                    r.func.append(WIRE_FUNCS.index(op.func))
                    r.root.append(0)
                r.flags.append(EMU_F_CROSS_NODE if c.n_nodes > 1 else 0)
            r.n_rec += c.n_ranks
            r.n_inst += 1
    r.rec_lo.append(r.n_rec)
    r.inst_lo.append(r.n_inst)
    return r
