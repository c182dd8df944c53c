"""The retuner of a job split by communicator (``dynamiccl central --partitions j=2 --retune``): the
partitions' windows and the job's combined changes reach its one retuner, on partition 0's owner, in
the loop's order, and it decides what the retuner of the same job unsplit decides on the same records."""
from __future__ import annotations

import json
import re

import pytest

from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.scaleout.central import CentralShard, detector_loop
from dynamiccl.scaleout.change_bus import ChangeHub
from dynamiccl.scaleout.combiner import Note, encode_note
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, units
from dynamiccl.scaleout.retuning import CentralRetuning, retuner_factory
from tests.scaleout.helpers import PER_NODE, Clock
from tests.scaleout.test_partitioned import NRANKS, _config, _node_messages, _scenario

JOBS = {"j": frozenset(f"node{n}" for n in range(NRANKS // PER_NODE))}


def _retuning(tmp_path, name, **kw):
    return CentralRetuning(RetunerConfig(**kw), str(tmp_path / f"tuner-{name}-{{job}}.conf"),
                           str(tmp_path / f"audit-{name}-{{job}}.jsonl")).validate(JOBS)


def run(ev, tmp_path, partitions, *, name=None, tamper=None, deliver=lambda job, c: None, **kw):
    """Every window of the records through one shard (its units' notes through a ChangeHub when
    partitioned), the job's retuner dry run; (audit lines, retuner, hub or None, shard)."""
    name = name or f"p{partitions}"
    clock, retuners = Clock(), {}
    factory = retuner_factory(_retuning(tmp_path, name, **kw), retuners, clock=lambda: 0.0)
    cfg = MergerConfig(units(JOBS, {"j": partitions}))
    hub = None
    if partitions > 1:
        hub = ChangeHub({"j": partitions}, lambda u: True, clock, deliver, retuner=factory)
    shard = CentralShard("s0", cfg, ShardTable(1.5, clock), {}, detector_loop(_config(), make_retuner=factory),
                         clock)
    by_window: dict[int, list] = {}
    for m in _node_messages(ev, partitions):
        by_window.setdefault(int(m.msg_id.split("/")[2]), []).append(m)

    def round_():
        steps = shard.poll()
        if hub is not None:
            hub.steps(steps)
            for subj, data in hub.outgoing():
                hub.receive(tamper(subj, data) if tamper else data, subj)
            hub.round()

    for w in sorted(by_window):
        for m in by_window[w]:
            assert shard.handle(m) == "filed"
        for dt in (0.5, 0.5, 1.5):
            clock.t += dt
            round_()
    clock.t += cfg.max_lateness_s
    round_()
    if hub is not None:
        hub.close()
    for jr in retuners.values():
        jr.close()
    path = tmp_path / f"audit-{name}-j.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()], retuners["j"], hub, shard


def _decision(a: dict) -> dict:
    """An audit line less the change's magnitude (checked apart) and the wall time, the partitioned job's
    change ids (the combiner's, ``rc-j-combined-N``) written as the unsplit job's (the detector's, ``rc-j-N``)."""
    return {k: re.sub(r"rc-j-combined-(\d+)", r"rc-j-\1", v) if isinstance(v, str) else v
            for k, v in a.items() if k not in ("magnitude", "ts")}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 5])
def test_two_partitions_retune_as_the_unsplit_job(tmp_path, seed):
    ev = _scenario(seed)
    whole, rt1, _, _ = run(ev, tmp_path, 1)
    combined: dict = {}
    split, rt2, hub, _ = run(ev, tmp_path, 2, deliver=lambda job, c: combined.setdefault(c.id, c))
    m1, m2 = rt1.retuner.metrics, rt2.retuner.metrics
    assert m2.counters["windows"] == m1.counters["windows"] >= 30
    assert m2.counters["observations"] == m1.counters["observations"] > 0
    assert m2.counters["changes"] == m1.counters["changes"] >= 3
    assert hub.counters["retuner_windows_partial"] == 0 and hub.counters["retuner_windows_late"] == 0
    assert hub.counters["retuner_changes_late"] == 0
    assert len(split) == len(whole) >= 3, (split, whole)
    assert [_decision(a) for a in split] == [_decision(b) for b in whole]
    # a combined change's magnitude is its first member's (the median ratio of that partition's streams);
    # the unsplit job's, the median over all of them, lies between its members' (a median of a union does)
    for a, b in zip(split, whole):
        if "magnitude" in a:
            members = [m["magnitude"] for m in combined[a["regime"]].evidence["merged"]]
            assert a["magnitude"] in members
            assert min(members) <= b["magnitude"] <= max(members), (a, b, members)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 5])
def test_applying_two_partitions_write_the_unsplit_jobs_tuner_file_byte_for_byte(tmp_path, seed):
    """With --apply (explorations, probes, pushes, aborts: 7 versions on these records) the partitioned
    job's retuner writes exactly the tuner file, versions and rules, of the job unsplit."""
    ev = _scenario(seed)
    kw = dict(dry_run=False, jobs=("j",), allow_unauthenticated=True)
    whole, rt1, _, _ = run(ev, tmp_path, 1, **kw)
    split, rt2, _, _ = run(ev, tmp_path, 2, **kw)
    assert rt2.retuner.metrics.version == rt1.retuner.metrics.version >= 5
    assert {a["action"] for a in split} >= {"explore", "probe", "push"}
    assert [_decision(a) for a in split] == [_decision(b) for b in whole]
    assert (tmp_path / "tuner-p2-j.conf").read_bytes() == (tmp_path / "tuner-p1-j.conf").read_bytes()


# ---------------------------------------------------------------- the feed, on hand-made notes (fast)

class _Recorder:
    """A retuner that records what it is handed, in order."""

    def __init__(self):
        self.seen: list = []

    def on_window(self, wf):
        self.seen.append(("w", round(wf.window_start), wf.keys.height, wf.counters["inputs_authenticated"]))

    def on_change(self, rc):
        self.seen.append(("c", rc.kind, rc.detected_s))

    def on_transient_end(self, te):
        self.seen.append(("t", te.ends))


def _wf(w, comm, auth=1):
    import polars as pl

    from dynamiccl.collector.features import KEYS_SCHEMA, WindowFeatures, empty_ranks
    row = {"job_id": "j", "comm_hash": comm, "comm_name": "", "func": "AllReduce", "algo": "RING", "proto": "SIMPLE",
           "size_bucket": 20, "nranks": 8, "nnodes": 1, "instances": 5, "lat_mean_s": 1e-3, "lat_p50_s": 1e-3,
           "lat_p90_s": 2e-3, "tuner_config_version": 0}
    keys = pl.DataFrame([row], schema={k: KEYS_SCHEMA[k] for k in row})
    return WindowFeatures(float(w), 1.0, keys, empty_ranks(), {"inputs_authenticated": auth})


def _rc(p, w, kind="bandwidth"):
    from dynamiccl.detector.events import RegimeChange
    return RegimeChange(id=f"rc-j.{p}-1", kind=kind, job_id="j", start_s=float(w - 1), detected_s=float(w + 1),
                        magnitude=2.0, comms=[f"0x{p + 1:x}"])


def _note(p, w, changes=(), auth=1, ended=()):
    from dynamiccl.scaleout.retuner_feed import window_rows
    return encode_note(Note("j", p, float(w + 1), tuple(changes), window_rows(_wf(w, p + 1, auth)), tuple(ended)))


def _hub(bus_authenticated=True):
    clock, rec = Clock(), _Recorder()
    hub = ChangeHub({"j": 2}, lambda u: True, clock, lambda job, c: None, retuner=lambda job: rec,
                    bus_authenticated=bus_authenticated)
    return hub, rec, clock


SUBJ = "dynamiccl.changes.j"


def test_windows_and_the_combined_change_reach_the_retuner_in_loop_order():
    hub, rec, clock = _hub()
    handed = []
    for w in range(10, 16):
        for p in (0, 1):
            hub.receive(_note(p, 21 - w if w < 12 else w) if p else _note(p, w, [_rc(p, w)] if w == 12 else []),
                        SUBJ)
        hub.round()
        handed.append(len(rec.seen))
        clock.t += 1.0
    # partition 1's windows 10 and 11 arrive swapped: each goes once both partitions have it, in order;
    # window 12 (end 13) waits until the combiner released the drop partition 0 detected in it (once
    # partition 1 ran 2 s past it without one), so the change comes right after its window, as on one loop
    assert rec.seen == [("w", 10, 2, 1), ("w", 11, 2, 1), ("w", 12, 2, 1), ("c", "bandwidth", 13.0),
                        ("w", 13, 2, 1), ("w", 14, 2, 1), ("w", 15, 2, 1)]
    assert handed == [0, 2, 2, 2, 6, 7]
    assert hub.counters["retuner_windows_joined"] == 6 and hub.counters["retuner_changes"] == 1


def test_a_duplicate_is_counted_once_a_missing_partition_after_the_lateness_and_late_rows_refused():
    hub, rec, clock = _hub()
    for data in (_note(0, 10), _note(0, 10), _note(1, 10), _note(0, 11)):
        hub.receive(data, SUBJ)
    hub.round()
    assert hub.counters["retuner_windows_duplicate"] == 1 and [s[1] for s in rec.seen] == [10]
    clock.t += 10.0                                          # partition 1 never reports window 11
    hub.round()
    assert rec.seen[-1] == ("w", 11, 1, 0)                   # a partial window counts as not authenticated
    assert hub.counters["retuner_partitions_missing"] == 1 and hub.counters["retuner_windows_partial"] == 1
    hub.receive(_note(1, 11), SUBJ)
    hub.round()
    assert hub.counters["retuner_windows_late"] == 1 and len(rec.seen) == 2


@pytest.mark.parametrize("bus_auth,auths,expect", [(True, (1, 1), 1), (True, (1, 0), 0), (False, (1, 1), 0)])
def test_a_window_is_authenticated_only_when_every_partition_and_this_bus_are(bus_auth, auths, expect):
    hub, rec, _ = _hub(bus_authenticated=bus_auth)
    for p in (0, 1):
        hub.receive(_note(p, 10, auth=auths[p]), SUBJ)      # a note claiming auth on an open bus proves nothing
    hub.round()
    assert rec.seen == [("w", 10, 2, expect)]


def _mangle(what):
    import json as _json
    d = _json.loads(_note(1, 10, [_rc(1, 10)]))
    cols = d["window"]["cols"]
    if what == "missing_column":
        del cols["lat_mean_s"]
    elif what == "unequal":
        cols["instances"].append(3)
    elif what == "wrong_type":
        cols["func"] = [7]
    elif what == "unknown_column":
        cols["password"] = ["x"]
    elif what == "bad_auth":
        d["window"]["auth"] = 2
    elif what == "bad_ended":
        d["ended"] = [{"id": "x"}]
    elif what == "not_json":
        return b"{"
    return _json.dumps(d).encode()


@pytest.mark.parametrize("what", ["missing_column", "unequal", "wrong_type", "unknown_column", "bad_auth",
                                  "bad_ended", "not_json"])
def test_a_malformed_note_is_refused_whole_and_counted(what):
    hub, rec, _ = _hub()
    hub.receive(_note(0, 10), SUBJ)
    hub.receive(_mangle(what), SUBJ)
    hub.round()
    assert hub.counters["notes_malformed"] == 1
    assert hub.combiners["j"].counters["changes_in"] == 0 and rec.seen == []   # nothing of it went anywhere


def test_a_note_of_another_job_than_its_subject_is_refused():
    hub, rec, _ = _hub()
    hub.receive(_note(0, 10), "dynamiccl.changes.k")
    hub.round()
    assert hub.counters["notes_subject_mismatch"] == 1 and rec.seen == [] and hub.combiners["j"].counters["notes"] == 0


def test_without_the_retuner_a_note_is_as_before():
    hub = ChangeHub({"j": 2}, lambda u: True, Clock(), lambda job, c: None)

    class _Step:
        window, changes, ended = _wf(10, 1), [], []
    hub.steps([("j.0", _Step())])
    (_, data), = hub.outgoing()
    assert data == encode_note(Note("j", 0, 11.0)) and b'"window":' not in data


def test_a_job_wide_transient_ends_once_when_every_member_partition_ended_it():
    from dynamiccl.detector.events import TransientEnd
    from dynamiccl.scaleout.retuner_feed import transient_json
    hub, rec, clock = _hub()

    def end(p, w):
        return transient_json(TransientEnd(id=f"rc-j.{p}-1.end", job_id="j.%d" % p, ends=(f"rc-j.{p}-1",),
                                           start_s=float(w), detected_s=float(w + 1), magnitude=0.5))
    for w in range(10, 17):
        for p in (0, 1):
            ended = [end(p, w)] if (p, w) in ((0, 14), (1, 16)) else []
            hub.receive(_note(p, w, [_rc(p, w)] if w == 12 else [], ended=ended), SUBJ)
        hub.round()
        clock.t += 1.0
    cid = next(s for s in rec.seen if s[0] == "c")
    assert cid == ("c", "bandwidth", 13.0)
    assert rec.seen[-2:] == [("w", 16, 2, 1), ("t", ("rc-j-combined-1",))]    # after partition 1's, not 0's
    assert hub.counters["retuner_transient_ends"] == 1 and hub.counters["retuner_transients_unmatched"] == 0


def test_partition_0_moving_away_drops_the_join_and_coming_back_rebuilds_the_retuner():
    """The retuner lives with partition 0: a shard that loses it hands its combiner's groups on and drops
    the windows it was joining (counted); the shard that gains it builds the job's retuner again through
    the factory (which seeds it from the bus's tuner file: scaleout/retuning.py)."""
    clock, owned, built = Clock(), [True], []

    def factory(job):
        built.append(job)
        return _Recorder()
    hub = ChangeHub({"j": 2}, lambda u: owned[0], clock, lambda job, c: None, retuner=factory)
    hub.receive(_note(0, 10), SUBJ)
    hub.round()
    assert built == ["j"] and hub.feeds["j"].join.oldest() == 10
    owned[0] = False
    hub.receive(_note(1, 10), SUBJ)
    hub.round()
    assert "j" not in hub.feeds and hub.counters["retuner_windows_dropped"] == 1
    assert hub.counters["notes_not_combined"] == 1
    owned[0] = True
    for p in (0, 1):
        hub.receive(_note(p, 11), SUBJ)
    hub.round()
    assert built == ["j", "j"] and hub.feeds["j"].retuner.seen == [("w", 11, 2, 0)]   # an open bus: not authenticated



def test_a_change_whose_window_never_comes_reaches_the_retuner_after_the_lateness():
    hub, rec, clock = _hub()
    hub.receive(encode_note(Note("j", 0, 13.0, (_rc(0, 12),))), SUBJ)    # notes without windows (a shard
    hub.receive(encode_note(Note("j", 1, 13.0, (_rc(1, 12),))), SUBJ)    # not started with --retune)
    hub.round()
    assert rec.seen == []
    clock.t += 10.0
    hub.round()
    assert rec.seen == [("c", "bandwidth", 13.0)] and hub.counters["retuner_changes_late"] == 1


def test_central_accepts_retune_with_partitions_and_still_validates(monkeypatch, capsys):
    from dynamiccl.cli import main
    from dynamiccl.scaleout import cli
    monkeypatch.setattr(cli, "_run", lambda coro_of_stop: 0)          # validated; the shard is not started
    base = ["central", "--shard", "s0", "--job", "j=n0,n1", "--partitions", "j=2"]
    assert main([*base, "--retune", "--audit", "off"]) == 0
    assert main([*base, "--apply"]) == 2 and "--apply-job" in capsys.readouterr().err
