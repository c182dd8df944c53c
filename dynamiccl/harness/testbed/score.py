"""Scores detections against the ground truth: the run's last line.

Each detection is matched to the latest truth change whose onset precedes it (by wall clock:
the detection's ``wall_s`` is when the detector emitted it in this process). It is a hit when it
comes within ``match_s`` of that onset, is of the right direction (a throttle / ``bulk_on`` needs
a degradation, a release / ``bulk_off`` / softer throttle an improvement: a ``recovery`` or a softer
step, `Detection.degrades`) and is the first for that change;
anything else — before the first change, too late, wrong direction, a second report of the same
change — is a false alarm. The delay of a hit is ``wall_s − onset_wall`` (onset taken before
the ``tc`` command), so it includes the window, the allowed lateness and the transport.
A throttle of one rank's link is *localised* when the change's ``ranks`` starts with that rank
(bulk traffic into one rank is reported in the rows but not required to be localised).

>>> from dynamiccl.harness.testbed.controller import TruthEvent
>>> ev = [TruthEvent(0, "throttle", [2], False, True, 0, 100.0, 100.0, 200, 80, "t"),
...       TruthEvent(1, "release", [2], False, False, 7, 107.0, 107.0, 80, 200, "r")]
>>> det = [Detection("a", "straggler", 101.8, ranks=[2]), Detection("b", "recovery", 109.1, ranks=[2]),
...        Detection("c", "latency", 110.0)]
>>> s = score(ev, det)
>>> s.line()
'changes=2 detected=2 false_alarms=1 max_delay_s=2.10 localised=1/1'
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["Detection", "Score", "score"]


@dataclass
class Detection:
    id: str
    kind: str
    wall_s: float                 # epoch seconds when the detector emitted it
    start_s: float = float("nan")  # the change's estimated onset (event time)
    detected_s: float = float("nan")
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    magnitude: float = float("nan")
    recovers: str | None = None
    step: str | None = None        # ``evidence["step"]`` of a step inside an incident

    @property
    def degrades(self) -> bool:
        """A recovery, a softer step of an open incident (`dynamiccl.detector.steps`: a change
        of the incident's kind with ``evidence.step == "softer"``) and an incident of falling
        latency (no incident open: magnitude, new over old, below 1) report an improvement."""
        return self.kind != "recovery" and self.step != "softer" and not self.magnitude < 1.0

    @classmethod
    def from_change(cls, rc, wall_s: float) -> "Detection":
        return cls(rc.id, rc.kind, wall_s, rc.start_s, rc.detected_s, list(rc.ranks), list(rc.hosts),
                   rc.magnitude, rc.recovers, (rc.evidence or {}).get("step"))


@dataclass
class Score:
    changes: int
    detected: int
    false_alarms: int
    max_delay_s: float
    localised: int
    localisable: int
    rows: list[dict]          # one per truth change: the matched detection and delays
    false: list[dict]         # the false alarms and why

    def line(self) -> str:
        md = f"{self.max_delay_s:.2f}" if self.max_delay_s == self.max_delay_s else "nan"
        return (f"changes={self.changes} detected={self.detected} false_alarms={self.false_alarms} "
                f"max_delay_s={md} localised={self.localised}/{self.localisable}")

    def meets(self, limit_s: float = 3.0) -> bool:
        return (self.changes > 0 and self.detected == self.changes and self.false_alarms == 0
                and self.max_delay_s <= limit_s and self.localised == self.localisable)

    def as_dict(self) -> dict:
        return asdict(self)


def score(events, detections, *, match_s: float = 5.0) -> Score:
    events = sorted(events, key=lambda e: e.onset_wall)
    matched: dict[int, tuple[Detection, float]] = {}
    false: list[dict] = []
    for d in sorted(detections, key=lambda d: d.wall_s):
        prior = [e for e in events if e.onset_wall <= d.wall_s]
        if not prior:
            false.append({"detection": asdict(d), "why": "before the first change"})
            continue
        e = prior[-1]
        delay = d.wall_s - e.onset_wall
        if delay > match_s:
            false.append({"detection": asdict(d), "why": f"{delay:.1f}s after change {e.index}"})
        elif d.degrades != e.degrades:
            false.append({"detection": asdict(d), "why": f"wrong direction for change {e.index} ({e.do})"})
        elif e.index in matched:
            false.append({"detection": asdict(d), "why": f"second report of change {e.index}"})
        else:
            matched[e.index] = (d, delay)
    rows, delays = [], []
    localised = localisable = 0
    for e in events:
        hit = matched.get(e.index)
        row = {"index": e.index, "description": e.description, "onset_wall": e.onset_wall,
               "detected": hit is not None}
        if hit is not None:
            d, delay = hit
            delays.append(delay)
            row.update(id=d.id, kind=d.kind, delay_s=round(delay, 3), ranks=d.ranks,
                       event_delay_s=round(d.detected_s - e.onset_wall, 3),
                       onset_error_s=round(d.start_s - e.onset_wall, 3))
        if e.do == "bulk_on" and e.single_rank is not None and hit is not None:
            row["localised"] = bool(hit[0].ranks) and hit[0].ranks[0] == e.single_rank
        if e.do == "throttle" and e.single_rank is not None:
            localisable += 1
            ok = hit is not None and bool(hit[0].ranks) and hit[0].ranks[0] == e.single_rank
            localised += ok
            row["localised"] = ok
        rows.append(row)
    return Score(changes=len(events), detected=len(matched), false_alarms=len(false),
                 max_delay_s=max(delays) if delays else float("nan"), localised=localised,
                 localisable=localisable, rows=rows, false=false)
