"""A partitioned job's combiner moves with its partition 0 (``dynamiccl central --partitions``): its ids
go on, its state is saved in the liveness bucket and the next owner goes on from it, replaying the
notes it heard since (scaleout/change_bus.py, scaleout/combiner.py)."""
from __future__ import annotations

from dynamiccl.scaleout.change_bus import ChangeHub
from tests.scaleout.helpers import Clock
from tests.scaleout.test_partitioned_retuner import SUBJ, _note, _rc


def test_a_jobs_combined_ids_go_on_when_partition_0_comes_back():
    """The shard keeps the job's retuner while partition 0 is away (its versions, its memory): the
    combiner it builds on the way back must not name a new change with an id that retuner has seen."""
    clock, owned, ids = Clock(), [True], []
    hub = ChangeHub({"j": 2}, lambda u: owned[0], clock, lambda job, c: ids.append(c.id))
    for w, own in ((12, True), (20, False), (30, True)):
        owned[0] = own
        hub.round()
        for p in (0, 1):
            hub.receive(_note(p, w, [_rc(p, w)]), SUBJ)
        hub.round()
    assert ids == ["rc-j-combined-1", "rc-j-combined-2"]


def test_the_next_owner_of_partition_0_goes_on_from_the_combiners_saved_state():
    """Partition 0's owner A dies holding partition 0's drop (partition 1 has not run past it yet) and
    without saving its last round: the next owner B restores A's saved state, replays the notes it heard
    since, and releases the drop once with the job's next id; what A released does not come again."""
    clock, owner, store = Clock(), ["A"], {}
    out: dict = {"A": [], "B": []}
    hubs = {s: ChangeHub({"j": 2}, lambda u, s=s: owner[0] == s, clock, lambda job, c, s=s: out[s].append(c.id),
                         stored=store.get) for s in "AB"}
    alive = ["A", "B"]
    for w in range(10, 17):
        if w == 14:                                   # A dies after running window 13's notes, unsaved
            alive, owner[0] = ["B"], "B"
        for p in (0, 1):
            change = [_rc(p, w, "straggler")] if w == 10 else [_rc(p, w)] if (p, w) == (0, 12) else []
            data = _note(p, w, change)
            for s in alive:
                hubs[s].receive(data, SUBJ)
        for s in alive:
            hubs[s].round()
            if w != 13:
                store.update(hubs[s].snapshots())
        clock.t += 1.0
    assert out == {"A": ["rc-j-combined-1"], "B": ["rc-j-combined-2"]}
    b = hubs["B"].counters
    assert b["combiner_restored"] == 1 and b["notes_replayed"] == 2     # window 13 of both partitions


def test_a_saved_combiner_state_that_is_not_usable_is_refused_and_counted():
    from dynamiccl.scaleout.combiner import ChangeCombiner, CombinerConfig
    good = ChangeCombiner("j", CombinerConfig(2), Clock()).snapshot()
    for bad in (b"{", good.replace(b'"job":"j"', b'"job":"k"'), good.replace(b'"marks":{}', b'"marks":{"5":1.0}')):
        hub = ChangeHub({"j": 2}, lambda u: True, Clock(), lambda job, c: None, stored=lambda job: bad)
        hub.receive(_note(0, 10), SUBJ)
        hub.round()
        assert hub.counters["combiner_restore_failed"] == 1 and hub.counters["combiner_restored"] == 0, bad
        assert hub.combiners["j"].counters["notes"] == 1            # it starts empty and goes on


def test_an_owner_that_stops_saves_its_flushed_state_so_the_next_releases_nothing_twice():
    clock, owner, store = Clock(), ["A"], {}
    out: list = []
    hubs = {s: ChangeHub({"j": 2}, lambda u, s=s: owner[0] == s, clock, lambda job, c: out.append(c.id),
                         stored=store.get) for s in "AB"}
    for w in range(10, 16):
        if w == 13:                                   # A stops: its open group (the drop) is released now
            hubs["A"].close()
            store.update(hubs["A"].snapshots())
            owner[0] = "B"
        for p in (0, 1):
            data = _note(p, w, [_rc(p, w)] if (p, w) == (0, 12) else [])
            for s in ("AB" if w < 13 else "B"):
                hubs[s].receive(data, SUBJ)
        for s in ("AB" if w < 13 else "B"):
            hubs[s].round()
            store.update(hubs[s].snapshots())
        clock.t += 1.0
    assert out == ["rc-j-combined-1"] and hubs["B"].counters["combiner_restored"] == 1
    assert hubs["A"].combiners == {} and hubs["B"].combiners["j"].last_id == 1


def test_with_saved_state_a_shard_losing_partition_0_hands_its_open_group_on_unreleased():
    clock, owner, store = Clock(), ["A"], {}
    out: dict = {"A": [], "B": []}
    hubs = {s: ChangeHub({"j": 2}, lambda u, s=s: owner[0] == s, clock, lambda job, c, s=s: out[s].append(c.id),
                         stored=store.get) for s in "AB"}
    for w in range(10, 16):
        owner[0] = "A" if w < 13 else "B"              # a heartbeat flap: A is alive, B takes j.0 at 13
        for p in (0, 1):
            data = _note(p, w, [_rc(p, w)] if (p, w) == (0, 12) else [])
            for s in "AB":
                hubs[s].receive(data, SUBJ)
        for s in "AB":
            hubs[s].round()
            store.update(hubs[s].snapshots())
        clock.t += 1.0
    assert out == {"A": [], "B": ["rc-j-combined-1"]}
