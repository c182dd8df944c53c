"""Which communicator partition of a job a communicator belongs to: one function, the same on the
node collector (which splits its partials) and on the central tier (which merges per partition).

The communicator id (NCCL's 64-bit ``commHash``) goes through the splitmix64 finalizer first, so
ids that differ in few bits still spread evenly; the result depends on nothing but the id and the
count, so every process and every release agrees on it.

>>> comm_partition(0x1111_2222_3333_4444, 1)
0
>>> [comm_partition(c, 4) for c in (1, 2, 3, 4)] == [comm_partition(c, 4) for c in (1, 2, 3, 4)]
True
>>> comm_partition(5, 0)
Traceback (most recent call last):
...
ValueError: partitions 0: a job has 1 to 1024 communicator partitions
"""
from __future__ import annotations

__all__ = ["MAX_PARTITIONS", "comm_partition", "check_partitions"]

#: a bound on the consumers and mergers one job may ask of the central tier
MAX_PARTITIONS = 1024
_M64 = (1 << 64) - 1


def check_partitions(partitions: int) -> int:
    """``partitions`` when it is a valid count (ValueError naming it otherwise)."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions {partitions!r}: a job has 1 to {MAX_PARTITIONS} communicator partitions")
    return partitions


def comm_partition(comm_hash: int, partitions: int) -> int:
    """The partition (0 .. partitions-1) of communicator ``comm_hash`` in a job split ``partitions`` ways."""
    if check_partitions(partitions) == 1:
        return 0
    z = (int(comm_hash) + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return (z ^ (z >> 31)) % partitions
