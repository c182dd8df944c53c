"""The small value types every retuner module shares.

* :class:`Target` — what the retuner tunes: one (communicator, collective, log2 size bucket).
* :class:`Candidate` — one configuration the tuner plugin can express for a target.
* :class:`Observation` — measured durations of one target over an interval, tagged with what ran.

``size_bucket`` follows the feature stream: ``floor(log2(bytes))`` of the per-rank message (count × type size),
-1 for 0 bytes (:func:`dynamiccl.contracts.size_bucket`).
The tuner plugin sees NCCL's ``nBytes``, which for AllGather/ReduceScatter is ``nranks`` times larger
(nccl-plugin-abi.md §2.3); :meth:`Target.byte_range` gives the rule's byte range in the plugin's units.

>>> t = Target(0x1f, "AllGather", 20, nranks=8, nnodes=2)
>>> t.byte_range()          # 1 MiB per rank x 8 ranks, as the plugin sees it
(8388608, 16777215)
>>> Candidate("RING", "LL128", 8).name
'RING/LL128/8'
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dynamiccl.contracts.collectives import FULL_BUFFER_FUNCS, bucket_range, tuner_token
from dynamiccl.contracts.collectives import size_bucket as bucket_of
from dynamiccl.nccl_tuner_plugin.config import ALGOS, PROTOS, Rule

__all__ = ["Target", "Candidate", "Observation", "FULL_BUFFER_FUNCS", "bucket_of", "CHUNK_GRAIN", "CHUNK_MAX",
           "chunk_allowed"]

# NCCL's chunk grain per protocol (device.h ncclProtoGrainSize); the tuner plugin rounds a rule's chunk up to it
# and caps it at CHUNK_MAX (its DCT_MAX_CHUNK). A candidate names only whole grains within the cap, so the chunk
# written to the tuner file is the chunk NCCL runs.
CHUNK_GRAIN = {"LL": 16, "LL128": 1920, "SIMPLE": 512}
CHUNK_MAX = 1 << 30


def chunk_allowed(proto: str, chunk_bytes: int) -> bool:
    """0 (NCCL's chunk) or a whole number of ``proto``'s grains, at least one and at most CHUNK_MAX."""
    g = CHUNK_GRAIN.get(proto)
    return chunk_bytes == 0 or (g is not None and g <= chunk_bytes <= CHUNK_MAX and chunk_bytes % g == 0)


@dataclass(frozen=True, order=True)
class Target:
    comm_hash: int
    func: str
    size_bucket: int
    nranks: int = 0      # 0 = unknown (no model; exploration only)
    nnodes: int = 0
    comm_name: str = ""

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.comm_hash, self.func, self.size_bucket)

    @property
    def comm_hex(self) -> str:
        return f"0x{self.comm_hash:x}"

    def byte_range(self) -> tuple[int, int]:
        """Inclusive NCCL ``nBytes`` range of this bucket, in the plugin's units."""
        mult = self.nranks if (self.func in FULL_BUFFER_FUNCS and self.nranks > 0) else 1
        lo, hi = bucket_range(self.size_bucket)
        if hi == 0:                  # the 0-byte bucket: 0 bytes whatever the multiplier
            return 0, 0
        return lo * mult, (hi + 1) * mult - 1

    def nbytes(self) -> int:
        """Representative NCCL nBytes for the cost model (the bucket's geometric middle)."""
        lo, hi = self.byte_range()
        return int(math.sqrt(lo * (hi + 1)))

    def label(self) -> dict[str, str]:
        return {"comm_name": self.comm_name or self.comm_hex, "func": self.func,
                "size_bucket": str(self.size_bucket)}


@dataclass(frozen=True, order=True)
class Candidate:
    """(algorithm, protocol, channel budget, chunk size); ``n_channels == 0`` keeps NCCL's channel count and
    ``chunk_bytes == 0`` NCCL's chunk size (:func:`chunk_allowed` says which chunks a candidate may name)."""

    algo: str
    proto: str
    n_channels: int = 0
    chunk_bytes: int = 0

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"candidate: unknown algorithm {self.algo!r} (expected one of {', '.join(ALGOS)})")
        if self.proto not in PROTOS:
            raise ValueError(f"candidate: unknown protocol {self.proto!r} (expected one of {', '.join(PROTOS)})")
        if not 0 <= self.n_channels <= 64:
            raise ValueError(f"candidate: channel count {self.n_channels} outside 0..64")
        if not chunk_allowed(self.proto, self.chunk_bytes):
            raise ValueError(f"candidate: chunk size {self.chunk_bytes} is not 0 or a multiple of {self.proto}'s "
                             f"grain {CHUNK_GRAIN[self.proto]} up to {CHUNK_MAX}")

    @property
    def name(self) -> str:
        base = f"{self.algo}/{self.proto}/{self.n_channels}"
        return f"{base}/c{self.chunk_bytes}" if self.chunk_bytes else base

    @classmethod
    def parse(cls, text: str) -> "Candidate":
        parts = text.split("/")
        if len(parts) not in (2, 3, 4) or (len(parts) == 4 and not parts[3].lower().startswith("c")):
            raise ValueError(f"candidate {text!r}: expected ALGO/PROTO[/CHANNELS[/cCHUNK]]")
        return cls(parts[0].upper(), parts[1].upper(), int(parts[2]) if len(parts) >= 3 else 0,
                   int(parts[3][1:]) if len(parts) == 4 else 0)

    def rule(self, target: Target) -> Rule:
        """The tuner rule that runs this candidate for ``target`` (``ValueError`` if no rule can name it)."""
        token = tuner_token(target.func)
        if token is None:
            raise ValueError(f"{target.func} has no tuner token: NCCL never asks the tuner about it")
        lo, hi = target.byte_range()
        return Rule(token, lo, hi, self.algo, self.proto, self.n_channels, self.chunk_bytes, target.comm_hash)


@dataclass(frozen=True)
class Observation:
    """Durations of one target measured over [t_start, t_end) (event time, s): ``n`` collectives with mean
    ``mean_s`` and variance ``var_s2`` (per collective). ``algo``/``proto``/``n_channels`` say what ran
    (None = unknown; ``n_channels`` is absent from the feature stream)."""

    target: Target
    t_start: float
    t_end: float
    n: int
    mean_s: float
    var_s2: float = 0.0
    algo: str | None = None
    proto: str | None = None
    n_channels: int | None = None
    version: int | None = None     # applied tuner-config version when the source knows it

    def valid(self) -> bool:
        return (self.n > 0 and math.isfinite(self.mean_s) and self.mean_s > 0 and math.isfinite(self.var_s2)
                and self.var_s2 >= 0 and math.isfinite(self.t_start) and self.t_end >= self.t_start)
