"""Records lost outside the aggregator's late / too-early gates reach the waits' lossy-window rule
(processors/wait_losses.py): queue_full, clock_range, window_full, delivery gaps, floods. In each case the
communicator (or, where only the job is known, the job) that lost records gives no waits in the affected
windows, while the others keep exactly the waits they give with no loss."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import WindowConfig, default_config
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.collector.processors.wait_losses import LossLedger, LossNote
from dynamiccl.collector.processors.window_agg import WindowAggregator
from dynamiccl.harness.collector_testing import SinkConsumer

from collector_helpers import connect, quiet_config, sock_path, wait_until  # noqa: F401 (fixtures)
from test_wait_streams import T0, _comm_wait_windows, job

pytest.importorskip("river")

W0 = T0 / 1e9                     # the first window's start, s


def _jobs() -> dict[tuple[str, int], np.ndarray]:
    """Job A with communicators 0xABC and 0xDEF, job B with 0xABC (4 ranks each, every record untimed)."""
    a2 = job(8.0, seed=13)
    a2["comm_hash"], a2["pid"] = 0xDEF, a2["pid"] + 100
    return {("A", 0xABC): job(8.0, seed=11), ("A", 0xDEF): a2, ("B", 0xABC): job(8.0, seed=12)}


def _ms(ev: np.ndarray) -> np.ndarray:
    return (ev["enqueue_ns"].astype(np.int64) - T0) // 1_000_000


def _slices(jobs):
    """Per 0.1 s of event time, one batch per (job, communicator)."""
    for lo in range(0, 8_000, 100):
        for (name, comm), ev in jobs.items():
            t = _ms(ev)
            part = ev[(t >= lo) & (t < lo + 100)]
            if len(part):
                yield lo, name, comm, part


def _waits(wfs) -> dict[tuple[str, int], set[float]]:
    return {k: _comm_wait_windows(wfs, *k) for k in (("A", 0xABC), ("A", 0xDEF), ("B", 0xABC))}


class _SyncQueue:
    """The aggregator's queue, run synchronously: a batch ``refuse`` picks is dropped through the real
    queue's ``on_drop`` (the pipeline's queue_full handler)."""

    def __init__(self, real, agg, refuse):
        self.on_drop, self.agg, self.refuse = real._on_drop, agg, refuse

    def consume(self, batch, block=False):
        if self.refuse(batch):
            self.on_drop(batch)
            return False
        self.agg.consume(batch)
        return True


def _pipeline_run(refuse=lambda b: False, spoil=lambda lo, name, comm, part: part):
    """The jobs through ``Pipeline.ingest`` (time gate, queue handler) into a real aggregator."""
    cfg = default_config().replace(receiver={"listen": ()}, parquet={"directory": None},
                                   prometheus={"address": None}, features={"address": None},
                                   window={"window_s": 0.5, "allowed_lateness_s": 0.5})
    p = Pipeline(cfg)
    sink = SinkConsumer()
    p.aggregator.next_consumer = sink
    p.queues["aggregator"] = _SyncQueue(p.queues["aggregator"], p.aggregator, refuse)
    for lo, name, comm, part in _slices(_jobs()):
        p.ingest(RecordBatch(spoil(lo, name, comm, part.copy()), f"h{name}{comm:x}", name, {}))
    p.aggregator.shutdown()
    return [r.features for r in sink.items], p.metrics


def _lost_slice(batch) -> bool:
    """A's 0xABC batches of 3.0-3.1 s and 5.0-5.1 s."""
    t = _ms(batch.events)
    return batch.job_id == "A" and int(batch.events["comm_hash"][0]) == 0xABC and int(t.min()) // 100 in (30, 50)


def test_a_batch_dropped_as_queue_full_withholds_its_communicators_waits_in_its_windows():
    """Fails before: the queue_full drop only counted, A's 0xABC gave waits in both windows."""
    clean, _ = _pipeline_run()
    wfs, m = _pipeline_run(refuse=_lost_slice)
    assert m.dropped["queue_full"] == 2 * 40
    before, after = _waits(clean), _waits(wfs)
    assert before[("A", 0xABC)] - after[("A", 0xABC)] == {W0 + 3.0, W0 + 5.0}
    assert after[("A", 0xDEF)] == before[("A", 0xDEF)] and after[("B", 0xABC)] == before[("B", 0xABC)]
    assert m.wait_lossy_cause["queue_full"] == 80 and m.wait_lossy_scope["job"] == 0


def _far_off(lo, name, comm, part):
    """One instance (its 4 records) of A's 0xABC at 3.0 s and at 5.0 s stamped an hour ahead."""
    if name == "A" and comm == 0xABC and lo in (3000, 5000):
        first = part["seq_number"] == part["seq_number"].min()
        part["enqueue_ns"][first] += np.uint64(3600 * 10**9)
    return part


def test_records_refused_by_the_clock_range_gate_withhold_their_communicator_in_the_open_windows():
    """Fails before: the clock_range drop only counted. Their event times are not trusted, so every window
    open when the drop is applied (here those from 1 s before it, the allowed lateness, to the window it
    arrived in) loses that communicator's waits; the others keep theirs."""
    clean, _ = _pipeline_run()
    wfs, m = _pipeline_run(spoil=_far_off)
    assert m.dropped["clock_range"] == 8
    before, after = _waits(clean), _waits(wfs)
    lost = before[("A", 0xABC)] - after[("A", 0xABC)]
    assert {W0 + 3.0, W0 + 5.0} <= lost <= {W0 + s for s in (2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5)}
    assert after[("A", 0xDEF)] == before[("A", 0xDEF)] and after[("B", 0xABC)] == before[("B", 0xABC)]
    assert m.wait_lossy_cause["clock_range"] == 8          # once each, however many windows they mark


def _window_full_run(pad_from_s: float | None):
    """Per 0.5 s window one batch of B, from ``pad_from_s`` a 20-record batch of job C, then one batch of A
    (0xDEF's records, then 0xABC's); ``max_window_records`` 600 holds B and A exactly, so C's records push
    A's last 20 (0xABC's 5 last instances) out as window_full."""
    jobs = _jobs()
    c = job(8.0, seed=14)
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=0.5, allowed_lateness_s=0.5, max_window_records=600),
                           next_consumer=sink, metrics=m, wall_clock=lambda: W0 + 100.0)
    for w in range(16):
        pick = [ev[_ms(ev) // 500 == w] for ev in jobs.values()]
        agg.consume(RecordBatch(pick[2], "hB", "B", {}))
        if pad_from_s is not None and w * 0.5 >= pad_from_s:
            agg.consume(RecordBatch(c[_ms(c) // 500 == w][:20], "hC", "C", {}))
        agg.consume(RecordBatch(np.concatenate([pick[1], pick[0]]), "hA", "A", {}))
    agg.shutdown()
    return [r.features for r in sink.items], m


def test_records_dropped_as_window_full_withhold_their_communicator_in_that_window():
    """Fails before: window_full drops only counted, A's 0xABC gave waits from its cut windows."""
    clean, m0 = _window_full_run(None)
    wfs, m = _window_full_run(3.0)
    assert m0.dropped["window_full"] == 0 and m.dropped["window_full"] == 10 * 20
    before, after = _waits(clean), _waits(wfs)
    assert before[("A", 0xABC)] - after[("A", 0xABC)] == {W0 + 0.5 * w for w in range(6, 16)}
    assert after[("A", 0xDEF)] == before[("A", 0xDEF)] and after[("B", 0xABC)] == before[("B", 0xABC)]
    assert m.wait_lossy_cause["window_full"] == 200


def _gap_run(gap_at_ms: int | None, lost: int = 40):
    """The jobs through one aggregator in 0.1 s slices; at ``gap_at_ms`` A's 0xABC slice is lost by the plugin
    (never sent) and the record_seq jump is told before A's next batch, as the receiver does."""
    sink, m = SinkConsumer(), SelfMetrics()
    agg = WindowAggregator(WindowConfig(window_s=0.5, allowed_lateness_s=0.5), next_consumer=sink, metrics=m,
                           wall_clock=lambda: W0 + 100.0)
    for lo, name, comm, part in _slices(_jobs()):
        if (name, comm, lo) == ("A", 0xABC, gap_at_ms):
            continue
        if (name, comm, lo) == ("A", 0xDEF, gap_at_ms):   # the first batch after the jump
            agg.losses.note(LossNote("delivery_gap", "A", lost, t_hi_ns=int(part["enqueue_ns"].max())))
        agg.consume(RecordBatch(part, f"h{name}{comm:x}", name, {}))
    agg.shutdown()
    return [r.features for r in sink.items], m


def test_a_delivery_gap_withholds_the_jobs_waits_in_the_windows_open_at_the_gap():
    """The lost records' communicator is unknown: every communicator of A gives no waits in the windows open
    when the gap is seen (here from 1 s before it, the allowed lateness, up to the window of the first record
    after it); B keeps exactly its waits."""
    clean, _ = _gap_run(None)
    wfs, m = _gap_run(3000)
    before, after = _waits(clean), _waits(wfs)
    for comm in (0xABC, 0xDEF):
        lost = before[("A", comm)] - after[("A", comm)]
        assert W0 + 3.0 in lost and lost <= {W0 + 2.0, W0 + 2.5, W0 + 3.0}
    assert after[("B", 0xABC)] == before[("B", 0xABC)]
    assert m.wait_lossy_cause["delivery_gap"] > 0 and m.wait_lossy_scope["communicator"] == 0


def test_a_forged_jump_of_2_to_the_40_records_is_a_count_not_an_allocation():
    """A plugin's record_seq jumping by 2^40 is counted, never held per record (a MemoryError before)."""
    clean, _ = _gap_run(None)
    wfs, m = _gap_run(3000, lost=1 << 40)
    assert m.wait_lossy_cause["delivery_gap"] == 1 << 40
    assert W0 + 3.0 in _waits(clean)[("A", 0xABC)] - _waits(wfs)[("A", 0xABC)]
    assert _waits(wfs)[("B", 0xABC)] == _waits(clean)[("B", 0xABC)]


def test_the_ledger_is_bounded_and_a_refused_note_withholds_every_job_in_the_open_windows():
    ledger = LossLedger(max_notes=2, max_records=10)
    ev = np.zeros(8, job(0.01).dtype)
    ledger.note(LossNote("queue_full", "A", 8, ev))
    ledger.note(LossNote("queue_full", "A", 8, ev))       # 16 records > 10: refused, counted
    ledger.note(LossNote("delivery_gap", "A", 3))
    ledger.note(LossNote("delivery_gap", "A", 4))         # a third note: refused
    notes, refused = ledger.take()
    assert [n.n for n in notes] == [8, 3] and refused == 12 and ledger.take() == ([], 0)

    def run(spoil: bool):
        sink, m = SinkConsumer(), SelfMetrics()
        agg = WindowAggregator(WindowConfig(window_s=0.5, allowed_lateness_s=0.5), next_consumer=sink,
                               metrics=m, wall_clock=lambda: W0 + 100.0)
        agg._waits.ledger = LossLedger(max_notes=0)
        for lo, name, comm, part in _slices(_jobs()):
            if spoil and (name, comm, lo) == ("A", 0xDEF, 3000):
                agg.losses.note(LossNote("delivery_gap", "A", 5))
            agg.consume(RecordBatch(part, f"h{name}{comm:x}", name, {}))
        agg.shutdown()
        return _waits([r.features for r in sink.items]), m
    before, _ = run(False)
    after, m = run(True)
    for k in before:
        assert W0 + 3.0 in before[k] - after[k]                 # every job, conservatively
    assert m.wait_lossy_cause["ledger_full"] == 5


# ---- over the stream receiver (real sockets): the receiver tells the gaps and floods ---------------------
def _send_a(quiet_config, sock_path, keep, **receiver):
    """A's 0xABC over one unix connection (one process, record_seq 1..n), the records ``keep`` picks."""
    from dynamiccl.collector.wire_format import EVENT_DTYPE
    from dynamiccl.harness.collector_testing import comm_record, encode_frame, encode_frames, process_record

    ev = job(8.0, seed=11)
    ev["record_seq"] = 1 + np.arange(len(ev))
    sent = ev[keep(ev)]
    cfg = quiet_config.replace(receiver={"listen": (f"unix:{sock_path}",), **receiver},
                               window={"window_s": 0.5, "allowed_lateness_s": 0.5, "idle_flush_s": 0.3})
    with Pipeline(cfg) as p:
        s = connect(p.addresses["listen"][0])
        s.sendall(encode_frame(np.concatenate([process_record("hA", "A", 100).view(EVENT_DTYPE),
                                               comm_record(0xABC, "world", pid=100).view(EVENT_DTYPE)])))
        s.sendall(encode_frames(sent[:800], per_frame=200))     # 0-0.8 s: under any rate limit
        assert wait_until(lambda: p.metrics.decoded == 800)
        try:
            s.sendall(encode_frames(sent[800:], per_frame=200))
        except OSError:                      # a flood: the collector closed the connection
            pass
        assert wait_until(lambda: p.metrics.decoded == len(sent) or p.metrics.dropped["flood"] > 0)
        assert wait_until(lambda: p.metrics.windows_emitted >= 1 and not p.aggregator._open)
        s.close()
    return p.metrics


def test_a_record_seq_jump_at_the_receiver_withholds_the_jobs_waits(quiet_config, sock_path):
    """Fails before: the jump was only counted (dynamiccl_collector_delivery_gap_records_total)."""
    m = _send_a(quiet_config, sock_path, lambda ev: (_ms(ev) < 3000) | (_ms(ev) >= 3100))
    assert m.gap_records == {("A", "hA"): 40}
    assert m.wait_lossy_cause["delivery_gap"] == 40 and m.wait_lossy.get("A", 0) > 0
    assert m.wait_lossy_scope == {"communicator": 0, "job": m.wait_lossy["A"]}


def test_records_dropped_as_a_flood_reach_the_lossy_rule(quiet_config, sock_path):
    """Fails before: the flood drop was only counted."""
    m = _send_a(quiet_config, sock_path, lambda ev: np.ones(len(ev), bool), max_records_per_s_per_connection=1000)
    assert m.dropped["flood"] > 0 and m.wait_lossy_cause["flood"] == m.dropped["flood"]
