"""The regime-change event: what the detector tells the retuner, Prometheus, the log and Grafana.

One JSON object per line on the detector's stream (contract in ``docs/architecture.md``).

>>> rc = RegimeChange(id="rc-job-1", kind="bandwidth", job_id="job", start_s=10.0, detected_s=11.0,
...                   magnitude=2.1, comms=["0x1f"], comm_names=["dp"], funcs=["AllReduce"], size_buckets=[24])
>>> RegimeChange.from_json(rc.to_json()) == rc
True
>>> RegimeChange.from_json('{"v": 1, "kind": "weather"}')
Traceback (most recent call last):
...
ValueError: regime change: unknown kind 'weather' (expected one of bandwidth, latency, straggler, flapping, recovery)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

KINDS = ("bandwidth", "latency", "straggler", "flapping", "recovery")
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RegimeChange:
    id: str
    kind: str
    job_id: str
    start_s: float            # estimated onset (event time): the CUSUM's last reset point
    detected_s: float         # event time of the window that triggered the change
    magnitude: float          # new/old latency ratio over the affected streams
    comms: list[str] = field(default_factory=list)        # communicator hashes, "0x…"
    comm_names: list[str] = field(default_factory=list)
    funcs: list[str] = field(default_factory=list)
    size_buckets: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)        # localisation; straggler: the rank first
    hosts: list[str] = field(default_factory=list)
    recovers: str | None = None                           # kind == "recovery": id of the change that ended
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"regime change: unknown kind {self.kind!r} (expected one of {', '.join(KINDS)})")

    @property
    def delay_s(self) -> float:
        return self.detected_s - self.start_s

    def to_json(self) -> str:
        return json.dumps({"v": SCHEMA_VERSION, **asdict(self)}, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, line: str | bytes) -> "RegimeChange":
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"regime change: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise ValueError("regime change: expected a JSON object")
        if d.get("v") != SCHEMA_VERSION:
            raise ValueError(f"regime change: unsupported version {d.get('v')!r} (this reader knows {SCHEMA_VERSION})")
        names = {f.name for f in fields(cls)}
        if d.get("kind") not in KINDS:
            raise ValueError(f"regime change: unknown kind {d.get('kind')!r} (expected one of {', '.join(KINDS)})")
        missing = [n for n in ("id", "kind", "job_id", "start_s", "detected_s", "magnitude") if n not in d]
        if missing:
            raise ValueError(f"regime change: missing field(s) {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class TransientEnd:
    """A transient excursion ended (`dynamiccl.detector.tracking.Tracking._transient`): its
    closing is no regime change, so it is not on the change stream the alerting and the scorer
    read; the loop hands it to the retuner alone, which reverts what it chose for the changes in
    ``ends`` as it would on their recovery (:meth:`as_recovery`).

    >>> te = TransientEnd(id="rc-j-3.end", job_id="j", ends=("rc-j-3",), start_s=12.0, detected_s=13.0,
    ...                   magnitude=0.5, comms=("0x1f",))
    >>> rc = te.as_recovery()
    >>> rc.kind, rc.recovers, rc.evidence["ends"], rc.evidence["transient"]
    ('recovery', 'rc-j-3', ['rc-j-3'], True)
    """
    id: str
    job_id: str
    ends: tuple[str, ...]     # the incident's change ids, its first report first
    start_s: float            # first window back at the old level (event time)
    detected_s: float         # end of the window that closed it
    magnitude: float          # new/old latency ratio at the closing (< 1: back down)
    comms: tuple[str, ...] = ()
    comm_names: tuple[str, ...] = ()
    funcs: tuple[str, ...] = ()
    size_buckets: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()

    def as_recovery(self) -> RegimeChange:
        """The recovery this transient's closing stands for (never published as one)."""
        return RegimeChange(
            id=self.id, kind="recovery", job_id=self.job_id, start_s=self.start_s, detected_s=self.detected_s,
            magnitude=self.magnitude, comms=list(self.comms), comm_names=list(self.comm_names),
            funcs=list(self.funcs), size_buckets=list(self.size_buckets), ranks=list(self.ranks),
            hosts=list(self.hosts), recovers=self.ends[0] if self.ends else None,
            evidence={"ends": list(self.ends), "transient": True})
