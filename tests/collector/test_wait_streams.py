"""Wait stand-ins for untimed records (NCCL 2.31+ after a send/recv): the collector's ``waits`` frame, and the
detector fed through the product path (window aggregator → Loop → Detector, as check 6b)."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig
from dynamiccl.collector.features import decode_line, encode_line
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.collector.wire_format import EVENT_DTYPE, FUNCS, EventFlags, Kind, TimingSource
from dynamiccl.harness.collector_testing import SinkConsumer

pytest.importorskip("river")

T0 = 1_700_000_000_000_000_000
NRANKS = 4
PERIOD_S = 0.01          # one AllReduce every 10 ms
DUR_S = 1e-3             # its GPU duration where timed


def job(seconds: float, *, seed: int = 0, late_rank: int | None = None, late_from_s: float = 0.0,
        late_s: float = 2e-3, timed_until_s: float = 0.0, start_s: float = 0.0) -> np.ndarray:
    """A 4-rank job of 256 KiB AllReduces: ranks enqueue with ~0.2 ms of jitter; from ``late_from_s`` on
    ``late_rank`` enqueues ``late_s`` later. Records before ``timed_until_s`` are GPU-timed, the rest
    untimed as NCCL 2.31+ leaves them after a send/recv (TIMING_SUSPECT)."""
    rng = np.random.default_rng(seed)
    n = int(seconds / PERIOD_S)
    t = start_s + np.arange(n) * PERIOD_S
    ev = np.zeros((n, NRANKS), EVENT_DTYPE)
    arrive = t[:, None] + rng.exponential(2e-4, (n, NRANKS))
    if late_rank is not None:
        arrive[:, late_rank] += np.where(t >= late_from_s, late_s, 0.0)
    ev["kind"], ev["func"] = Kind.COLL, FUNCS.index("AllReduce")
    ev["algo"], ev["proto"], ev["datatype"] = 1, 2, 6
    ev["rank"] = np.arange(NRANKS)
    ev["nranks"], ev["nnodes"] = NRANKS, 1
    ev["pid"] = 100 + np.arange(NRANKS)
    ev["comm_hash"], ev["bytes"], ev["count"] = 0xABC, 1 << 18, 1 << 16
    ev["seq_number"] = np.arange(n)[:, None]
    enq = T0 + (arrive * 1e9).astype(np.int64)
    ev["enqueue_ns"] = enq
    timed = (t < timed_until_s)[:, None] & np.ones(NRANKS, bool)
    done = T0 + ((arrive.max(axis=1, keepdims=True) + DUR_S * rng.lognormal(0, 0.05, (n, NRANKS))) * 1e9)
    ev["timing_source"] = np.where(timed, TimingSource.KERNEL_GPU, TimingSource.NONE)
    ev["gpu_start_ns"] = np.where(timed, enq + 5000, 0)
    ev["gpu_end_ns"] = np.where(timed, done.astype(np.int64), 0)
    ev["flags"] = np.where(timed, 0, EventFlags.TIMING_SUSPECT)
    return ev.reshape(-1)


def windows(ev: np.ndarray, **cfg) -> tuple[list, SelfMetrics]:
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=0.5, allowed_lateness_s=30.0, **cfg), next_consumer=sink,
                           metrics=m)
    agg.consume(RecordBatch(ev, "h0", "job", {}))
    agg.shutdown()
    return [r.features for r in sink.items], m


def detect(ev: np.ndarray) -> list:
    from dynamiccl.validate.detect import _run_detector
    changes, _ = _run_detector(ev, {100 + r: "h0" for r in range(NRANKS)})
    return changes


# ---- the collector's waits frame ------------------------------------------------------------------------
def test_waits_are_their_own_rows_and_keys_stay_as_they_were():
    ev = job(2.0, late_rank=3, late_s=2e-3)
    got, m = windows(ev)
    off, _ = windows(ev, wait_streams=False)
    for wf, ref in zip(got, off):
        assert wf.keys.equals(ref.keys)                        # the untimed records still count there, untimed
        w = wf.waits
        assert w.height == 1 and w["func"][0] == "AllReduce"
        assert w["algbw_Bps"][0] is None and w["busbw_Bps"][0] is None
        assert 1.5e-3 < w["lat_p50_s"][0] < 3e-3            # the three punctual ranks wait ~2 ms
        short = dict(zip(wf.ranks["rank"].to_list(), wf.ranks["shortest_count"].to_list()))
        assert short[3] == w["instances"][0] and sum(short.values()) == short[3]   # the last rank waits least
    assert m.wait["instances"] == 200 and sum(m.wait.values()) == 200


def test_timed_instances_get_no_wait():
    got, m = windows(job(1.0, timed_until_s=10.0))
    assert all(wf.waits is None for wf in got) and not any(m.wait.values())


def test_the_feature_line_carries_the_waits():
    from dynamiccl.detector.feature_decode import _fast, decode
    wf = windows(job(0.5))[0][0]
    line = encode_line(wf)
    for back in (decode_line(line), decode(line), _fast(line)):
        assert back.waits is not None and back.waits.equals(wf.waits)
    assert decode_line(encode_line(windows(job(0.5, timed_until_s=1.0))[0][0])).waits is None


# ---- bad input: counted, never a wait (and never a change) -------------------------------------------
def _missing_rank(ev):
    return ev[ev["rank"] != 2]


def _duplicates(ev):
    return np.concatenate([ev, ev[ev["rank"] == 1]])


def _absurd_gaps(ev):
    ev = ev.copy()
    hit = (ev["rank"] == 0) & (ev["seq_number"] % 3 == 0)
    ev["enqueue_ns"][hit] += np.uint64(int(0.4e9))     # 0.4 s: beyond max_wait_s = 0.1 below
    return ev


@pytest.mark.parametrize("spoil,outcome", [(_missing_rank, "missing_rank"), (_duplicates, "duplicate"),
                                           (_absurd_gaps, "gap")])
def test_bad_instances_are_counted_and_give_no_wait(spoil, outcome):
    ev = spoil(job(3.0))
    got, m = windows(ev, max_wait_s=0.1)
    assert m.wait[outcome] > 0
    assert m.wait["instances"] + m.wait[outcome] <= 300
    if outcome != "gap":
        assert m.wait["instances"] == 0 and all(wf.waits is None for wf in got)


@pytest.mark.parametrize("spoil", [_missing_rank, _duplicates])
def test_bad_instances_raise_no_change(spoil):
    """Rank 3 arrives late from 15 s on, but every instance lacks a rank or repeats one: no wait, no change."""
    assert detect(spoil(job(30.0, seed=3, late_rank=3, late_from_s=15.0))) == []


def test_absurd_gaps_raise_no_change():
    """Instances whose enqueues are seconds apart (a host clock stepping) are refused, the rest stationary."""
    ev = job(30.0, seed=5)
    hit = (ev["rank"] == 0) & (np.arange(len(ev)) // NRANKS % 7 == 0) & (ev["seq_number"] > 1500)
    ev["enqueue_ns"][hit] += np.uint64(int(3e9))
    assert [c for c in detect(ev) if c.kind != "recovery"] == []


# ---- the detector: wait streams monitored like any other -------------------------------------------------
def test_a_rank_arriving_late_on_an_untimed_job_is_named():
    """A 4-rank job whose records are all untimed; rank 3 starts enqueueing 2 ms late at 15 s."""
    changes = detect(job(30.0, seed=1, late_rank=3, late_from_s=15.0))
    onset = T0 / 1e9 + 15.0
    assert changes, "no change on the untimed job"
    first = changes[0]
    assert first.kind == "straggler" and first.ranks[0] == 3
    assert 0 <= first.detected_s - onset <= 5.0
    assert first.funcs == ["AllReduce:wait"] and first.evidence["timing"] == "wait"
    assert all(s["timing"] == "wait" for s in first.evidence["streams"])


def test_records_turning_untimed_are_not_a_change():
    """GPU-timed for 20 s (1 ms durations), then untimed (~0.2 ms waits): two streams, no change."""
    changes = detect(job(40.0, seed=2, timed_until_s=20.0))
    assert [c for c in changes if c.kind != "recovery"] == []


def test_windows_losing_records_as_late_give_no_waits():
    """Host h1's clock jumps 30 s ahead at 5 s: the watermark closes h0's windows early and most of h0's
    records arrive late (dropped, counted). The instances that stay complete are then a biased sample: those
    windows' instances are withheld, not given waits."""
    h0 = job(10.0, seed=6)
    h1 = job(10.0, seed=7)
    h1["comm_hash"], h1["pid"] = 0xDEF, h1["pid"] + 100
    t1 = h1["enqueue_ns"].astype(np.int64) - T0
    h1["enqueue_ns"] += np.where(t1 >= int(5e9), np.uint64(int(30e9)), np.uint64(0))
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=0.5, allowed_lateness_s=0.5), next_consumer=sink, metrics=m,
                           wall_clock=lambda: T0 / 1e9 + 100.0)
    for lo in range(0, 10_000, 100):                    # 0.1 s slices of event time, both hosts in turn
        for host, ev in (("h0", h0), ("h1", h1)):
            t = ev["enqueue_ns"].astype(np.int64) - T0
            part = ev[(t % int(30e9) >= lo * 1_000_000) & (t % int(30e9) < (lo + 100) * 1_000_000)]
            if len(part):
                agg.consume(RecordBatch(part, host, "job", {}))
    agg.shutdown()
    assert m.dropped["late"] > 0 and m.wait["withheld"] > 0
    h0_waits = [wf for wf in sink.items if wf.features.waits is not None
                and (wf.features.waits["comm_hash"] == 0xABC).any() and wf.features.window_start > T0 / 1e9 + 6]
    assert h0_waits == [], "waits from windows that lost records as late"


def test_a_malformed_waits_frame_drops_the_window_counted():
    """A waits frame without the key columns (a foreign producer) is refused like a malformed keys frame."""
    import dataclasses

    from dynamiccl.detector.service import Detector
    wf = windows(job(0.5))[0][0]
    det = Detector()
    assert det.process(dataclasses.replace(wf, waits=wf.waits.drop("lat_p50_s"))) == []
    assert det.metrics.value("dynamiccl_detector_windows_dropped_total", reason="malformed") == 1
    assert det.metrics.value("dynamiccl_detector_windows_dropped_total", reason="error") == 0
    det.process(dataclasses.replace(wf, window_start=wf.window_start + 1))
    assert det.metrics.value("dynamiccl_detector_windows_dropped_total", reason="malformed") == 1


def test_the_testbed_saves_and_replays_the_waits(tmp_path):
    """The test bed's saved windows (replayed offline by `harness.testbed.analyse`) keep the waits frame."""
    from types import SimpleNamespace

    from dynamiccl.harness.testbed.analyse import load_windows
    from dynamiccl.harness.testbed.run import Run
    got = windows(job(1.0))[0]
    timed = windows(job(0.5, timed_until_s=1.0, start_s=1.0))[0]
    Run._save_windows(SimpleNamespace(_saved=[(wf, 1.0) for wf in got + timed], out_dir=tmp_path))
    back = load_windows(tmp_path)
    assert len(back) == len(got) + len(timed)
    for (wf, _), ref in zip(back, got + timed):
        assert (wf.waits is None) == (ref.waits is None)
        assert ref.waits is None or wf.waits.equals(ref.waits)


def _feed_jobs(a: np.ndarray, b: np.ndarray, held: np.ndarray,
               max_comms: int | None = None) -> tuple[list, SelfMetrics]:
    """Jobs A and B through one collector in 0.1 s slices; A's ``held`` records arrive 3 s late."""
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=0.5, allowed_lateness_s=0.5), next_consumer=sink, metrics=m,
                           wall_clock=lambda: T0 / 1e9 + 100.0)
    if max_comms is not None:
        agg._waits.lost.max_comms = max_comms
    for lo in range(0, 11_000, 100):
        for name, ev, sel in (("A", a, ~held), ("B", b, np.ones(len(b), bool)), ("A", a, held)):
            t = (ev["enqueue_ns"].astype(np.int64) - T0) // 1_000_000 + (3000 if sel is held else 0)
            part = ev[sel & (t >= lo) & (t < lo + 100)]
            if len(part):
                agg.consume(RecordBatch(part, f"h{name}", name, {}))
    agg.shutdown()
    return [r.features for r in sink.items], m


def _two_jobs_one_losing_records(late_every: int) -> tuple[list, SelfMetrics]:
    """Jobs A and B (4 ranks each, every record untimed) through one collector in 0.1 s slices; from 3 s on,
    every ``late_every``-th instance of A (all its ranks' records, so no instance is left partial) arrives
    3 s late: dropped as late, counted against A."""
    a, b = job(8.0, seed=11), job(8.0, seed=12)
    rel = (a["enqueue_ns"].astype(np.int64) - T0) // 1_000_000             # ms
    held = (rel >= 3000) & (a["seq_number"] % late_every == 0) if late_every else np.zeros(len(a), bool)
    return _feed_jobs(a, b, held)


def _wait_windows(wfs: list, job_id: str) -> set[float]:
    return {wf.window_start for wf in wfs if wf.waits is not None and (wf.waits["job_id"] == job_id).any()}


def test_one_job_losing_records_withholds_only_its_own_waits():
    """The lossy-window rule is per job: A losing 5 % of its records as late withholds A's waits in those
    windows (counted per job), not B's (before: every job's waits in those windows were withheld)."""
    clean, _ = _two_jobs_one_losing_records(0)
    wfs, m = _two_jobs_one_losing_records(20)
    assert m.dropped["late"] > 0
    assert _wait_windows(wfs, "B") == _wait_windows(clean, "B"), "B's waits withheld for A's losses"
    lost_a = _wait_windows(clean, "A") - _wait_windows(wfs, "A")
    assert len(lost_a) >= 3, "A's windows that lost records still gave waits"
    assert m.wait_lossy.get("A", 0) > 0 and "B" not in m.wait_lossy


def _comms_one_losing_records(late_every: int, max_comms: int | None = None) -> tuple[list, SelfMetrics]:
    """Job A with two communicators (0xABC and 0xDEF, 4 ranks each, one batch per 0.1 s slice holding both) and
    job B (its communicator's hash 0xABC too), every record untimed; from 3 s on every ``late_every``-th
    instance of A's 0xABC (all its ranks' records) arrives 3 s late: dropped as late, attributed to it."""
    a1, a2, b = job(8.0, seed=11), job(8.0, seed=13), job(8.0, seed=12)
    a2["comm_hash"], a2["pid"] = 0xDEF, a2["pid"] + 100
    a = np.concatenate([a1, a2])
    rel = (a["enqueue_ns"].astype(np.int64) - T0) // 1_000_000             # ms
    held = (rel >= 3000) & (a["comm_hash"] == 0xABC) & (a["seq_number"] % late_every == 0) if late_every \
        else np.zeros(len(a), bool)
    return _feed_jobs(a, b, held, max_comms)


def _comm_wait_windows(wfs: list, job_id: str, comm: int) -> set[float]:
    return {wf.window_start for wf in wfs if wf.waits is not None
            and ((wf.waits["job_id"] == job_id) & (wf.waits["comm_hash"] == comm)).any()}


def test_one_communicator_losing_records_withholds_only_its_own_waits():
    """The lossy-window rule is per communicator: A's 0xABC losing 5 % of its records as late withholds its
    waits in those windows (counted against A, scope communicator); A's 0xDEF and B's 0xABC keep theirs
    (before: every communicator of A lost its waits in those windows)."""
    clean, _ = _comms_one_losing_records(0)
    wfs, m = _comms_one_losing_records(20)
    assert m.dropped["late"] > 0
    lost = _comm_wait_windows(clean, "A", 0xABC) - _comm_wait_windows(wfs, "A", 0xABC)
    assert len(lost) >= 3, "the communicator that lost records still gave waits"
    assert _comm_wait_windows(wfs, "A", 0xDEF) == _comm_wait_windows(clean, "A", 0xDEF), \
        "A's other communicator's waits withheld for 0xABC's losses"
    assert _comm_wait_windows(wfs, "B", 0xABC) == _comm_wait_windows(clean, "B", 0xABC)
    assert m.wait_lossy.get("A", 0) > 0 and "B" not in m.wait_lossy
    assert m.wait_lossy_scope == {"communicator": m.wait_lossy["A"], "job": 0} and m.wait_lossy_folded == 0


def test_drops_past_the_communicators_tracked_withhold_the_whole_job():
    """A drop not attributed to a communicator (here: none tracked, ``max_comms`` 0) counts against its job:
    every communicator of A loses its waits in those windows, counted (scope job, folded records); B keeps its."""
    clean, _ = _comms_one_losing_records(0)
    wfs, m = _comms_one_losing_records(20, max_comms=0)
    for comm in (0xABC, 0xDEF):
        assert len(_comm_wait_windows(clean, "A", comm) - _comm_wait_windows(wfs, "A", comm)) >= 3
    assert _comm_wait_windows(wfs, "B", 0xABC) == _comm_wait_windows(clean, "B", 0xABC)
    assert m.wait_lossy_scope["job"] == m.wait_lossy["A"] > 0 and m.wait_lossy_folded == m.dropped["late"]


def test_a_drop_of_an_unknown_communicator_counts_against_the_job():
    from dynamiccl.collector.processors.wait_window import WaitWiring
    w, m = WaitWiring(), SelfMetrics()
    w.dropped(3, np.array([-1, -1, 5, 5, 5]), m)
    assert w.lost.take() == ({5: 3}, {3: 2}) and m.wait_lossy_folded == 0
