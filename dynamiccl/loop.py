"""The loop: window → detector → retuner, in one fixed order. The demo, replay, the test bed, the
evaluations and the retuner service all run it, so a replay of a run's records makes the decisions the
live run made.

Per window, in this order (the order the split services see: the detector's change for a window reaches
the retuner after that window's features, which the collector sent to both):

1. the detector reads the window and returns its regime changes;
2. the retuner ingests the window's measurements (``on_window``);
3. each change goes to every sink, in the order given, then to the retuner (``on_change``);
4. each transient the window closed (the detector's ``ended``: an excursion whose end is no regime
   change) goes to the retuner alone (``on_transient_end``), never to the sinks: the retuner reverts
   what it chose for it as on a recovery, and nothing user-facing hears of it.

Nothing here reads a clock: time is the windows' event time, which the detector and the retuner already
use. A sink that raises is counted and logged and the loop goes on (one broken sink never stops the
others, nor the retuner).

>>> class Det:
...     def process(self, wf): return ["c%d" % wf] if wf % 2 else []
>>> class Rt:
...     def __init__(self): self.seen = []
...     def on_window(self, wf): self.seen.append(("w", wf))
...     def on_change(self, c): self.seen.append(("c", c)); return 7
>>> rt, got = Rt(), []
>>> loop = Loop(Det(), rt, sinks=[got.append])
>>> [s.versions for s in loop.run([0, 1])], got, rt.seen
([[], [7]], ['c1'], [('w', 0), ('w', 1), ('c', 'c1')])

:class:`ChangeOrder` gives a retuner that receives the two streams separately (the retuner service) the
same order: a change waits until the window it was detected in has been ingested.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Sequence

__all__ = ["Loop", "Step", "ChangeOrder"]

log = logging.getLogger(__name__)


class _Detector(Protocol):
    def process(self, wf: Any) -> list: ...


class _Retuner(Protocol):
    def on_window(self, wf: Any) -> int | None: ...

    def on_change(self, rc: Any) -> int | None: ...


@dataclass
class Step:
    """What one window produced: its regime changes, the transients it closed (for the retuner only),
    the tuner versions the retuner wrote, and newer `where` verdicts on changes reported before
    (`dynamiccl.detector.where_refresh.WhereUpdate`)."""
    window: Any
    changes: list = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    ended: list = field(default_factory=list)
    where_updates: list = field(default_factory=list)


class Loop:
    """``step(window) -> Step``; ``run(windows) -> list[Step]``. ``retuner`` may be None (detection only)."""

    def __init__(self, detector: _Detector, retuner: _Retuner | None = None, *,
                 sinks: Sequence[Callable[[Any], None]] = ()) -> None:
        self.detector = detector
        self.retuner = retuner
        self.sinks = list(sinks)
        self.windows = 0
        self.changes = 0
        self.transient_ends = 0
        self.sink_errors = 0

    def step(self, wf: Any) -> Step:
        self.windows += 1
        out = Step(wf, list(self.detector.process(wf)))
        if self.retuner is not None:
            self._version(out, self.retuner.on_window(wf))
        for rc in out.changes:
            self.changes += 1
            for sink in self.sinks:
                self._emit(sink, rc)
            if self.retuner is not None:
                self._version(out, self.retuner.on_change(rc))
        out.ended = list(getattr(self.detector, "ended", None) or ())
        out.where_updates = list(getattr(self.detector, "where_updates", None) or ())
        hand = getattr(self.retuner, "on_transient_end", None)
        for te in out.ended:
            self.transient_ends += 1
            if hand is not None:
                self._version(out, hand(te))
        return out

    def run(self, windows: Iterable[Any]) -> list[Step]:
        return [self.step(wf) for wf in windows]

    @staticmethod
    def _version(out: Step, v: int | None) -> None:
        if v is not None:
            out.versions.append(v)

    def _emit(self, sink: Callable[[Any], None], rc: Any) -> None:
        try:
            sink(rc)
        except Exception:
            self.sink_errors += 1
            log.exception("loop: a change sink failed (counted; the loop goes on)")


def _window_end(wf: Any) -> float:
    return float(wf.window_start) + float(wf.window_s)


def _detected(rc: Any) -> float:
    return float(rc.detected_s)


class ChangeOrder:
    """Puts a separately delivered change stream back into the loop's order.

    ``window(wf)`` and ``change(rc)`` return the items to hand to the retuner now, as ``("window", wf)`` /
    ``("change", rc)`` pairs, in loop order: a change is released right after the first window whose end is
    at or after its ``detected_s`` (the window it was detected in), or at once when that window already
    went by. At most ``max_held`` changes wait, none longer than ``max_wait_s`` on the injected ``clock``
    (:meth:`due` releases them; both counted in ``forced``), so a change stream whose feature stream
    stalls still flows.

    >>> class W:
    ...     def __init__(self, t): self.window_start, self.window_s = t, 1.0
    >>> class C:
    ...     def __init__(self, t): self.detected_s = t
    >>> o = ChangeOrder()
    >>> o.change(C(11.0)), [k for k, _ in o.window(W(9.0))], [k for k, _ in o.window(W(10.0))]
    ([], ['window'], ['window', 'change'])
    >>> [k for k, _ in o.change(C(10.5))]      # its window already went by: at once
    ['change']
    """

    def __init__(self, max_held: int = 256, max_wait_s: float = 5.0, *,
                 clock: Callable[[], float] | None = None,
                 window_end: Callable[[Any], float] = _window_end,
                 detected: Callable[[Any], float] = _detected) -> None:
        self.max_held = max_held
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._end = window_end
        self._detected = detected
        self._held: deque = deque()
        self._last_end = float("-inf")
        self.forced = 0

    def window(self, wf: Any) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [("window", wf)]
        try:
            self._last_end = max(self._last_end, self._end(wf))
        except (AttributeError, TypeError, ValueError):
            return out                      # the retuner counts a malformed window; nothing to release
        while self._held and self._detected(self._held[0][1]) <= self._last_end:
            out.append(("change", self._held.popleft()[1]))
        return out

    def change(self, rc: Any) -> list[tuple[str, Any]]:
        try:
            t = self._detected(rc)
        except (AttributeError, TypeError, ValueError):
            return [("change", rc)]         # a JSON line or a malformed change: the retuner parses or counts it
        if t <= self._last_end:
            return [("change", rc)]
        self._held.append((self._clock() if self._clock else 0.0, rc))
        out = []
        while len(self._held) > self.max_held:
            self.forced += 1
            out.append(("change", self._held.popleft()[1]))
        return out

    def due(self) -> list[tuple[str, Any]]:
        """Changes held longer than ``max_wait_s`` (needs a ``clock``)."""
        out: list[tuple[str, Any]] = []
        if self._clock is None:
            return out
        now = self._clock()
        while self._held and now - self._held[0][0] >= self.max_wait_s:
            self.forced += 1
            out.append(("change", self._held.popleft()[1]))
        return out

    def flush(self) -> list[tuple[str, Any]]:
        """Every held change (at shutdown, or when the feature stream is known to be gone)."""
        out = [("change", rc) for _, rc in self._held]
        self._held.clear()
        return out
