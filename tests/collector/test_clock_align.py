"""Host clock steps corrected before windowing (`dynamiccl.collector.processors.clock_align`)."""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.component import FuncConsumer, RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.clock_align import MIN_INSTANCES, SAMPLE, ClockAlign
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.collector.wire_format import EVENT_DTYPE, Kind, TimingSource

T0 = 1_800_000_000 * 10**9
STEP = 5 * 10**9
PERIOD = 100_000_000       # one instance every 0.1 s
DUR = 50_000_000


def _records(seqs, rank, *, shift_ns=0, late_ns=0, kind=Kind.COLL):
    """One rank's records of instances ``seqs``: all ranks finish together; ``late_ns`` delays
    the rank's start (a straggler), ``shift_ns`` its clock."""
    ev = np.zeros(len(seqs), EVENT_DTYPE)
    ev["kind"], ev["timing_source"], ev["func"] = kind, TimingSource.KERNEL_CPU, 1
    ev["seq_number"], ev["rank"], ev["nranks"] = seqs, rank, 4
    ev["comm_hash"], ev["bytes"], ev["count"] = 0xABCD, 1 << 20, 1 << 18
    end = T0 + np.asarray(seqs, np.int64) * PERIOD + DUR + shift_ns
    ev["cpu_end_ns"] = end
    ev["enqueue_ns"] = end - DUR + late_ns
    return ev


def _feed(ca, hosts, n_batches, *, stepped=1, step_ns=STEP, from_batch=3, late_host=None, per=SAMPLE):
    gcomm = np.zeros(per, np.int64)
    moves = []
    for b in range(n_batches):
        seqs = np.arange(b * per, (b + 1) * per)
        for h in range(hosts):
            shift = step_ns if (h == stepped and b >= from_batch) else 0
            ev = ca.correct(h, _records(seqs, h, shift_ns=shift, late_ns=2 * 10**9 if h == late_host else 0))
            ca.observe(h, gcomm, ev)
        moves += [(b, h, s) for h, s in ca.update()]
    return moves


FAST = SAMPLE * MIN_INSTANCES     # instances per window: MIN_INSTANCES sampled ones each


def test_a_host_stepping_ahead_is_corrected_after_a_few_instances():
    ca = ClockAlign(1.0)
    moves = _feed(ca, 4, 12, per=FAST)
    assert len(moves) == 1
    b, h, step = moves[0]
    assert h == 1 and abs(step - STEP) < 1_000_000
    assert b == 3                              # its MIN_INSTANCES sampled instances after the step
    assert not ca._every.any()                 # a fast communicator stays sampled
    assert ca.offset_ns[1] == step and not ca.offset_ns[[0, 2, 3]].any()
    shifted = _records([200], 1, shift_ns=STEP)
    assert abs(int(ca.correct(1, shifted)["cpu_end_ns"][0]) - int(_records([200], 0)["cpu_end_ns"][0])) < 1_000_000


def test_a_host_stepping_back_is_corrected_too():
    ca = ClockAlign(1.0)
    (_, h, step), = _feed(ca, 3, 10, step_ns=-STEP)
    assert h == 1 and abs(step + STEP) < 1_000_000


def test_a_slow_communicators_step_is_seen_after_a_few_of_its_instances():
    """Two instances per window (a step-paced job): a sampled instance comes every fourth
    window, so the step would be seen after 4 x 4 windows; with every instance of a communicator
    that slow remembered, after MIN_INSTANCES instances (2 windows)."""
    ca = ClockAlign(1.0)
    (b, h, step), = _feed(ca, 4, 30, per=2, from_batch=8)
    assert h == 1 and abs(step - STEP) < 1_000_000
    assert b == 8 + MIN_INSTANCES // 2 - 1 and ca._every[0]


def test_a_straggler_starts_late_but_finishes_with_its_peers():
    """A rank that arrives 2 s late has the same finish times: no clock step."""
    ca = ClockAlign(1.0)
    assert _feed(ca, 4, 12, step_ns=0, late_host=2) == []


def test_a_step_below_the_threshold_is_left_alone():
    ca = ClockAlign(1.0)
    assert _feed(ca, 4, 12, step_ns=500_000_000) == []
    ca = ClockAlign(1.0)
    assert _feed(ca, 2, 12, step_ns=500_000_000) == []


def test_of_two_hosts_the_one_whose_timeline_jumped_is_corrected():
    """Host 1 of a pair steps ahead, then (another run) back: its own interval between two
    sampled instances jumps by the step, host 0's does not, so host 1 is corrected either way."""
    for sign in (1, -1):
        ca = ClockAlign(1.0)
        (b, h, step), = _feed(ca, 2, 12, step_ns=sign * STEP, per=FAST)
        assert h == 1 and abs(step - sign * STEP) < 1_000_000 and b == 3
        assert ca.offset_ns[0] == 0
        a = ca.correct(1, _records([200], 1, shift_ns=sign * STEP))["cpu_end_ns"][0]
        assert abs(int(a) - int(_records([200], 0)["cpu_end_ns"][0])) < 1_000_000


def test_of_two_hosts_without_a_timeline_the_one_behind_is_moved_forward():
    """A step before the pair has a usual interval (its first sampled instances): which clock
    moved is not told, so the host behind (host 0, host 1 having stepped ahead) is moved forward,
    which puts no record behind the windows."""
    ca = ClockAlign(1.0)
    (_, h, step), = _feed(ca, 2, 12, from_batch=1)
    assert h == 0 and abs(step + STEP) < 1_000_000 and ca.offset_ns[1] == 0


def test_a_host_with_many_peers_is_not_moved_by_its_pair():
    """Host 1 steps ahead; host 0 shares a 4-host communicator with it and a 2-host one: the
    4-host median corrects host 1, and host 0 is not moved by the pair."""
    ca = ClockAlign(1.0)
    moves = []
    for b in range(12):
        seqs = np.arange(b * SAMPLE, (b + 1) * SAMPLE)
        for gc, hosts in ((0, range(4)), (1, range(2))):
            for h in hosts:
                ev = _records(seqs, h, shift_ns=STEP if (h == 1 and b >= 3) else 0)
                ev = ca.correct(h, ev)
                ca.observe(h, np.full(SAMPLE, gc, np.int64), ev)
        moves += ca.update()
    assert [h for h, _ in moves] == [1] and ca.offset_ns[0] == 0


def test_one_host_with_many_ranks_and_reused_sequence_numbers_is_not_a_step():
    """Several ranks on one host, and a communicator whose sequence numbers start again 10 s
    later: one finish per (instance, host), so no host is compared with itself."""
    ca = ClockAlign(1.0)
    gcomm = np.zeros(8 * SAMPLE, np.int64)
    for rep in range(4):
        for rank in range(8):
            ca.observe(0, gcomm, _records(np.arange(8 * SAMPLE), rank, shift_ns=rep * 10 * 10**9))
        assert ca.update() == []


def test_send_recv_and_off_give_no_estimate():
    ca = ClockAlign(1.0)
    gcomm = np.zeros(SAMPLE, np.int64)
    for b in range(12):
        for h in range(4):
            ev = _records(np.arange(b * SAMPLE, (b + 1) * SAMPLE), h, shift_ns=STEP if h == 1 and b > 2 else 0,
                          kind=Kind.P2P)
            ca.observe(h, gcomm, ev)
        assert ca.update() == []
    off = ClockAlign(0.0)
    assert _feed(off, 4, 12) == [] and not off.enabled


def _aggregate(clock_align_s):
    out = []
    m = SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=1.0, allowed_lateness_s=30.0, clock_align_s=clock_align_s),
                           next_consumer=FuncConsumer(out.append), metrics=m, wall_clock=lambda: T0 / 1e9 + 1e6)
    for b in range(40):                              # 40 x 8 instances at 10/s: 32 s
        seqs = np.arange(b * 8, (b + 1) * 8)
        for h in range(3):
            shift = STEP if (h == 2 and b >= 10) else 0
            agg.consume(RecordBatch(_records(seqs, h, shift_ns=shift), f"host{h}", "job", {0xABCD: "world"}))
    agg.shutdown()
    return out, m


def _full_instances(out):
    """Per closed window: instances seen on all 3 ranks / instances seen."""
    full = []
    for r in out:
        keys = r.features.keys
        if keys.height:
            full.append(int(keys["records"].sum()) / max(int(keys["instances"].sum()), 1))
    return full


def test_the_aggregator_puts_a_stepped_hosts_records_back_with_its_peers():
    """Host 2's clock steps 5 s ahead at 8 s: with the correction every window after the first
    ten holds each instance on all three ranks, and the step is counted; without it, windows hold
    part of the ranks for the rest of the run."""
    out, m = _aggregate(1.0)
    coverage = _full_instances(out)
    assert m.clock_steps == 1 and m.clock_corrected > 0
    assert all(abs(c - 3.0) < 1e-9 for c in coverage[18:]), coverage
    out0, m0 = _aggregate(0.0)
    assert m0.clock_steps == 0
    assert sum(abs(c - 3.0) > 1e-9 for c in _full_instances(out0)[18:]) >= 10


def test_negative_and_absurd_durations_count_as_untimed_records():
    """A broken timer's record (ends before it starts, or 11 days later) is kept as an untimed
    record and counted: it moves neither the window's latencies nor its ranks' finish offsets."""
    out = []
    m = SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=1000.0), next_consumer=FuncConsumer(out.append), metrics=m,
                           wall_clock=lambda: T0 / 1e9 + 1e6)
    evs = [_records(np.arange(20), r) for r in range(3)]
    evs[1]["cpu_end_ns"][3] = evs[1]["enqueue_ns"][3] + 10**15
    evs[2]["cpu_end_ns"][4] = evs[2]["enqueue_ns"][4] - 1
    for r, ev in enumerate(evs):
        agg.consume(RecordBatch(ev, f"host{r}", "job", {0xABCD: "world"}))
    agg.shutdown()
    assert m.durations_refused == {"negative": 1, "too_long": 1}
    keys = out[0].features.keys
    assert int(keys["records"].sum()) == 60
    assert abs(float(keys["lat_mean_s"][0]) - DUR / 1e9) < 1e-6
