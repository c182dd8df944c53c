"""The loop's order, its sinks' isolation and ChangeOrder's bounds."""
from __future__ import annotations

from types import SimpleNamespace as NS

from dynamiccl.loop import ChangeOrder, Loop


class Det:
    def process(self, wf):
        return [NS(detected_s=wf.window_start + wf.window_s, id=f"c{wf.window_start:g}")] if wf.window_start % 2 else []


class Rt:
    def __init__(self):
        self.seen = []

    def on_window(self, wf):
        self.seen.append(("window", wf.window_start))

    def on_change(self, rc):
        self.seen.append(("change", rc.id))
        return len(self.seen)


def W(t):
    return NS(window_start=float(t), window_s=1.0)


def test_window_then_its_changes_and_a_broken_sink_stops_nothing():
    rt, got = Rt(), []

    def broken(rc):
        raise RuntimeError("sink down")

    loop = Loop(Det(), rt, sinks=[broken, got.append])
    steps = loop.run([W(0), W(1), W(2)])
    assert rt.seen == [("window", 0.0), ("window", 1.0), ("change", "c1"), ("window", 2.0)]
    assert [c.id for c in got] == ["c1"] and loop.sink_errors == 1
    assert [s.versions for s in steps] == [[], [3], []] and (loop.windows, loop.changes) == (3, 1)


def test_change_order_holds_until_its_window_and_is_bounded():
    now = [0.0]
    o = ChangeOrder(max_held=2, max_wait_s=5.0, clock=lambda: now[0])
    c = [NS(detected_s=t) for t in (3.0, 4.0, 5.0)]
    assert o.change(c[0]) == [] and o.change(c[1]) == []
    assert o.change(c[2]) == [("change", c[0])] and o.forced == 1          # more than max_held: oldest goes
    w = W(2.0)
    assert o.window(w) == [("window", w)]                                    # ends at 3.0: c[0] already out
    now[0] = 6.0
    assert o.due() == [("change", c[1]), ("change", c[2])] and o.forced == 3  # held longer than max_wait_s
    assert o.change("not a change") == [("change", "not a change")]         # the retuner counts it
    assert o.flush() == []


def test_a_step_carries_the_detectors_where_updates():
    class WithUpdates(Det):
        where_updates: list = []

        def process(self, wf):
            self.where_updates = [NS(id="c1", where={"rank": 2})] if wf.window_start == 2 else []
            return super().process(wf)

    steps = Loop(WithUpdates()).run([W(1), W(2)])
    assert [len(s.where_updates) for s in steps] == [0, 1] and steps[1].where_updates[0].id == "c1"
