"""Frame decoding: every field, rare record kinds, bad headers, partial frames, gaps."""
from __future__ import annotations

import numpy as np
import pytest

from dynamiccl.collector.decode import GapTracker, ProtocolError, StreamDecoder
from dynamiccl.harness.collector_testing import (comm_record, encode_frame, header, process_record, stats_record,
                               synthetic_events)
from dynamiccl.collector.wire_format import EVENT_DTYPE, MAX_RECORDS_PER_FRAME


def _random_events(n, seed=3):
    """Every byte random (valid kind), so a field decoded from the wrong offset would show."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n, 128), dtype=np.uint8)
    ev = raw.view(EVENT_DTYPE).ravel().copy()
    ev["kind"] = rng.integers(1, 3, n)
    return ev


def test_decodes_every_field_across_frames():
    ev = _random_events(300)
    data = (encode_frame(process_record("nodeA", "job-7", 42)) + encode_frame(ev[:100])
            + encode_frame(ev[100:300]))
    dec = StreamDecoder()
    res = dec.feed(memoryview(data))
    assert res.consumed == len(data) and res.n_records == 301
    assert dec.host == "nodeA" and dec.job_id == "job-7" and dec.pid == 42
    assert res.events.dtype == EVENT_DTYPE
    for name in EVENT_DTYPE.names:
        np.testing.assert_array_equal(res.events[name], ev[name], err_msg=name)


def test_comm_and_stats_records_and_order_within_frame():
    ev = synthetic_events(5, nranks=2)
    recs = np.concatenate([process_record("h", "j", 9).view(EVENT_DTYPE),
                           comm_record(0xABC, "dp_group", pid=9).view(EVENT_DTYPE), ev,
                           stats_record(9, records_sent=77, events_dropped_pool_full=3).view(EVENT_DTYPE)])
    dec = StreamDecoder()
    res = dec.feed(encode_frame(recs))
    assert dec.comm_names == {0xABC: "dp_group"}
    assert len(res.events) == 10 and len(res.stats) == 1
    assert int(res.stats[0]["records_sent"]) == 77 and int(res.stats[0]["events_dropped_pool_full"]) == 3
    assert res.seqs.tolist()[2:12] == ev["record_seq"].tolist()


def test_partial_frame_is_left_for_the_next_read():
    data = encode_frame(process_record("h", "j", 1)) + encode_frame(synthetic_events(4, nranks=2))
    dec = StreamDecoder()
    res = dec.feed(data[:-5])
    assert res.consumed == 16 + 128 and res.events is None
    res = dec.feed(data[res.consumed:])
    assert len(res.events) == 8


@pytest.mark.parametrize("hdr,reason", [
    (dict(magic=0xDEADBEEF), "bad_magic"), (dict(version=9), "bad_version"),
    (dict(record_size=64), "bad_record_size"),
])
def test_bad_headers(hdr, reason):
    with pytest.raises(ProtocolError) as exc:
        StreamDecoder().feed(encode_frame(process_record("h", "j", 1), **hdr))
    assert exc.value.reason == reason


def test_too_many_records_rejected_from_header_alone():
    with pytest.raises(ProtocolError) as exc:
        StreamDecoder().feed(header(MAX_RECORDS_PER_FRAME + 1))
    assert exc.value.reason == "too_many_records"


def test_events_before_process_record():
    with pytest.raises(ProtocolError) as exc:
        StreamDecoder().feed(encode_frame(synthetic_events(2, nranks=2)))
    assert exc.value.reason == "no_process"


def test_gap_tracker_counts_jumps_ignores_resends_and_keys_by_process():
    g = GapTracker()
    assert g.observe(("h", 1, 0), np.array([5, 6, 7], np.uint64)) == (0, 0)  # first sight: no gap
    assert g.observe(("h", 1, 0), np.array([8, 12, 13], np.uint64)) == (3, 1)
    assert g.observe(("h", 1, 0), np.array([2, 14, 20], np.uint64)) == (5, 1)  # 2 is a re-send
    assert g.observe(("h", 2, 0), np.array([100], np.uint64)) == (0, 0)
    assert g.observe(("h", 1, 0), np.array([0, 21], np.uint64)) == (0, 0)  # 0 = unassigned
