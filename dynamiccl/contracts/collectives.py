"""One table of NCCL's collectives, algorithms and protocols, as every stage names them.

A collective has one row: its wire code (index in the profiler record's ``func`` enum, the order NCCL's
profiler strings are listed in), the token the tuner config file uses for it (``None``: NCCL never asks the
tuner about it, so no rule can name it), its index in NCCL's cost model (``ncclFunc_t``; ``None``: not
modelled), whether it is point-to-point, its nccl-tests bus-bandwidth factor and its ``ncclFunc_t`` value.

The wire spells all-to-all ``AlltoAll`` (NCCL's profiler string) and the tuner grammar ``AllToAll`` (the C
plugin's token table); :func:`tuner_token` is the one translation between them.

>>> collective("AlltoAll").tuner_token, collective("AllToAll").name
('AllToAll', 'AlltoAll')
>>> tuner_token("Gather") is None, busbw_factor("AllReduce", 8), busbw_factor("AlltoAll", 8)
(True, 1.75, 0.875)
>>> [size_bucket(b) for b in (0, 1, 2, 3, 1024, 1025)], bucket_range(-1), bucket_range(10)
([-1, 0, 1, 1, 10, 10], (0, 0), (1024, 2047))
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Collective", "COLLECTIVES", "FUNCS", "TUNER_FUNCS", "COST_FUNCS", "P2P_FUNCS",
           "FULL_BUFFER_FUNCS", "ALGOS", "PROTOS", "BUSBW_ONE", "BUSBW_ALLREDUCE", "BUSBW_N_MINUS_1",
           "collective", "tuner_token", "busbw_factor", "size_bucket", "bucket_range"]

# bus-bandwidth factor kinds (nccl-tests doc/PERFORMANCE.md): 1; 2(n-1)/n; (n-1)/n
BUSBW_ONE, BUSBW_ALLREDUCE, BUSBW_N_MINUS_1 = 0, 1, 2


@dataclass(frozen=True)
class Collective:
    name: str                    # wire name: the string NCCL's profiler passes
    code: int                    # wire code: index in FUNCS
    tuner_token: str | None      # token in the tuner config file; None: the tuner is never asked
    tuner_index: int | None      # index in the C tuner's FUNC_NAMES (dynamiccl/nccl_tuner_plugin/src/rules.c)
    cost_index: int | None       # ncclFunc_t in NCCL's cost model; None: not modelled
    p2p: bool                    # point-to-point: no algorithm/protocol choice
    busbw: int                   # BUSBW_* kind
    nccl_func: int               # ncclFunc_t value (nccl-plugin-abi.md §2.2): what NCCL passes the tuner
    full_buffer: bool = False    # NCCL's nBytes is nranks x the per-rank bytes (AllGather, ReduceScatter)


_B1, _AR, _NM1 = BUSBW_ONE, BUSBW_ALLREDUCE, BUSBW_N_MINUS_1
# Wire order = nccl-plugin-abi.md §1.6 string list; tuner order = ncclFunc_t for the five collectives the
# tuner sees, then all-to-all (the C plugin's dct_func_index maps ncclFuncAlltoAll to 5).
COLLECTIVES: tuple[Collective, ...] = (
    #          wire name     code  tuner token   tuner cost  p2p    busbw nccl_func
    Collective("AllGather", 0, "AllGather", 2, 2, False, _NM1, 2, full_buffer=True),
    Collective("AllReduce", 1, "AllReduce", 4, 4, False, _AR, 4),
    Collective("AlltoAll", 2, "AllToAll", 5, None, False, _NM1, 8),
    Collective("Broadcast", 3, "Broadcast", 0, 0, False, _B1, 0),
    Collective("Gather", 4, None, None, None, False, _B1, 10),
    Collective("Recv", 5, None, None, None, True, _B1, 7),
    Collective("Reduce", 6, "Reduce", 1, 1, False, _B1, 1),
    Collective("ReduceScatter", 7, "ReduceScatter", 3, 3, False, _NM1, 3, full_buffer=True),
    Collective("Scatter", 8, None, None, None, False, _B1, 9),
    Collective("SendRecv", 9, None, None, None, True, _B1, 5),
    Collective("Send", 10, None, None, None, True, _B1, 6),
    Collective("PutSignal", 11, None, None, None, True, _B1, 12),
    Collective("Signal", 12, None, None, None, True, _B1, 13),
    Collective("WaitSignal", 13, None, None, None, True, _B1, 14),
)
assert all(c.code == i for i, c in enumerate(COLLECTIVES))

FUNCS: tuple[str, ...] = tuple(c.name for c in COLLECTIVES)
_TUNABLE = sorted((c for c in COLLECTIVES if c.tuner_index is not None), key=lambda c: c.tuner_index or 0)
TUNER_FUNCS: tuple[str, ...] = tuple(str(c.tuner_token) for c in _TUNABLE)
COST_FUNCS: tuple[str, ...] = tuple(c.name for c in sorted(
    (c for c in COLLECTIVES if c.cost_index is not None), key=lambda c: c.cost_index or 0))
P2P_FUNCS: tuple[str, ...] = tuple(c.name for c in COLLECTIVES if c.p2p)
FULL_BUFFER_FUNCS: tuple[str, ...] = tuple(c.name for c in COLLECTIVES if c.full_buffer)
assert [c.tuner_index for c in _TUNABLE] == list(range(len(TUNER_FUNCS)))

# NCCL_ALGO_* / NCCL_PROTO_* order: the same index on the wire, in the tuner file and in the cost table.
ALGOS: tuple[str, ...] = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
PROTOS: tuple[str, ...] = ("LL", "LL128", "SIMPLE")

_BY_NAME = {c.name: c for c in COLLECTIVES} | {c.tuner_token: c for c in COLLECTIVES if c.tuner_token}


def collective(name: str | int) -> Collective:
    """The row for a wire name, a tuner token or a wire code; ``ValueError`` naming the known ones."""
    if isinstance(name, int) and not isinstance(name, bool):
        if 0 <= name < len(COLLECTIVES):
            return COLLECTIVES[name]
        raise ValueError(f"collective code {name} outside 0..{len(COLLECTIVES) - 1}")
    c = _BY_NAME.get(name)   # type: ignore[arg-type]
    if c is None:
        raise ValueError(f"unknown collective {name!r} (expected one of {', '.join(FUNCS)})")
    return c


def tuner_token(name: str) -> str | None:
    """The tuner file's token for a collective (wire name or token), None when no rule can name it."""
    return collective(name).tuner_token


def busbw_factor(name: str | int, nranks: int) -> float:
    """nccl-tests bus-bandwidth factor: 2(n-1)/n AllReduce; (n-1)/n AllGather, ReduceScatter, AlltoAll; 1 else."""
    kind = collective(name).busbw
    if kind == BUSBW_ALLREDUCE:
        return 2.0 * (nranks - 1) / nranks
    if kind == BUSBW_N_MINUS_1:
        return (nranks - 1) / nranks
    return 1.0


def size_bucket(nbytes: int) -> int:
    """``floor(log2(bytes))`` of the per-rank message; -1 for 0 bytes (no message has a bucket of its own)."""
    if nbytes < 0:
        raise ValueError(f"size_bucket: negative byte count {nbytes}")
    return int(nbytes).bit_length() - 1


def bucket_range(bucket: int) -> tuple[int, int]:
    """Inclusive per-rank byte range of a bucket: (2**b, 2**(b+1) - 1); bucket -1 is exactly 0 bytes."""
    if bucket < -1:
        raise ValueError(f"size bucket {bucket} below -1")
    if bucket == -1:
        return 0, 0
    return 1 << bucket, (1 << (bucket + 1)) - 1
