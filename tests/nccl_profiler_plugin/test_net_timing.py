"""Per-peer network timing (opt-in: ProxyOp (8) in DYNAMICCL_EVENT_MASK, ProxyStep (16) for the state
times): the plugin folds an operation's ProxyOp/ProxyStep events into one PEER record per (peer,
direction) after the operation's own record. The emulator's EMU_F_NET gives every channel a send
proxy op to rank+1 and a receive proxy op from rank-1, EMU_PROXY_STEPS (2) steps each, every step
through its direction's three states, transSize 128 KiB at SendWait/RecvWait."""
from __future__ import annotations

import numpy as np

from dynamiccl.collector import wire_format as wf
from dynamiccl.collector.decode import StreamDecoder
from test_emulator_stream import FLAG, check_events, make_ops

NET_MASK = 70 | 8 | 16
CHUNK = 1 << 17
STEPS = 2


def test_peer_records_per_operation_and_direction(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops = make_ops(40, flags=FLAG["NET"])
    plain = make_ops(10, seq0=100)  # no proxy events: no PEER record
    res = run_scenario([
        {"op": "init", "hash": 0x9E, "nranks": 4, "rank": 1, "threads": 2}, {"op": "run", "ops": ops + plain},
        {"op": "sync"}, {"op": "finalize"},
    ], sock_addr, env={"DYNAMICCL_EVENT_MASK": str(NET_MASK)})
    assert res["ok"], res
    ev = col.events()
    check_events(ev, ops + plain, comm_hash=0x9E, rank=1, nranks=4, nnodes=1)
    peers = np.array(col.records(wf.Kind.PEER), dtype=wf.PEER_DTYPE)
    assert len(peers) == 2 * len(ops)
    nch = {o["seq_number"]: o["n_channels"] for o in ops}
    for p in peers:
        n = nch[int(p["seq_number"])]
        assert int(p["peer"]) == (2 if p["is_send"] else 0) and int(p["rank"]) == 1
        assert int(p["comm_hash"]) == 0x9E and int(p["parent_kind"]) == wf.Kind.COLL
        assert int(p["proxy_ops"]) == n and int(p["steps"]) == n * STEPS
        assert int(p["bytes"]) == n * STEPS * CHUNK
        assert np.all(p["state_ns"] > 0), p["state_ns"]  # every state held for some time
        assert int(p["reserved"][0]) == 0  # no (peer, direction) pair refused
    enq = {int(r["seq_number"]): int(r["enqueue_ns"]) for r in ev}
    assert all(int(p["enqueue_ns"]) == enq[int(p["seq_number"])] for p in peers)
    seqs = np.sort(np.concatenate([ev["record_seq"], peers["record_seq"]]))
    assert seqs[0] == 1 and np.all(np.diff(seqs) == 1), "PEER records take ring positions: no gap"
    st = res["stats"]
    assert st["records_emitted"] == len(ev) + len(peers) == st["records_sent"]


def test_off_by_default(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    res = run_scenario([{"op": "init", "hash": 0x9F, "threads": 2}, {"op": "run", "ops": make_ops(20, flags=FLAG["NET"])},
                        {"op": "sync"}, {"op": "finalize"}], sock_addr)
    assert res["ok"], res
    assert len(col.events()) == 20 and not col.records(wf.Kind.PEER)


def test_collector_decodes_peer_records_and_their_sequence():
    """StreamDecoder: PEER records are decoded (not counted invalid) and their record_seq is read."""
    recs = np.zeros(3, dtype=wf.EVENT_DTYPE)
    proc = recs[0:1].view(wf.PROCESS_DTYPE)
    proc["kind"], proc["pid"], proc["host"] = wf.Kind.PROCESS, 7, b"h"
    recs[1]["kind"], recs[1]["record_seq"] = wf.Kind.COLL, 1
    peer = recs[2:3].view(wf.PEER_DTYPE)
    peer["kind"], peer["peer"], peer["bytes"], peer["record_seq"] = wf.Kind.PEER, 3, 4096, 2
    header = np.array([(wf.MAGIC, wf.VERSION, wf.RECORD_SIZE, len(recs), 0)], dtype=wf.HEADER_DTYPE)
    res = StreamDecoder().feed(header.tobytes() + recs.tobytes())
    assert res.n_invalid_kind == 0 and len(res.events) == 1
    assert len(res.peers) == 1 and int(res.peers[0]["peer"]) == 3 and int(res.peers[0]["bytes"]) == 4096
    assert list(res.seqs) == [0, 1, 2]


def test_collector_exports_emulated_peer_records(run_scenario, sock_addr, tmp_path):
    """End to end: the emulator's PEER records through the collector's stream receiver into the peer
    windows: Prometheus rows per (rank, peer, direction) and the parquet table, sums equal to the records."""
    import polars as pl
    from prometheus_client import generate_latest

    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.pipeline import Pipeline

    cfg = default_config().replace(receiver={"listen": (sock_addr,)}, parquet={"directory": str(tmp_path / "pq")},
                                   prometheus={"address": None}, features={"address": None},
                                   telemetry={"gpu": False})
    ops = make_ops(30, flags=FLAG["NET"])
    with Pipeline(cfg) as p:
        res = run_scenario([{"op": "init", "hash": 0xA7, "nranks": 4, "rank": 1, "threads": 2},
                            {"op": "run", "ops": ops}, {"op": "sync"}, {"op": "finalize"}],
                           sock_addr, env={"DYNAMICCL_EVENT_MASK": str(NET_MASK)})
        assert res["ok"], res
    want_bytes = sum(o["n_channels"] for o in ops) * STEPS * CHUNK
    text = generate_latest(p.registry).decode()
    rows = {ln.split("{", 1)[1].split("}")[0]: float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines() if ln.startswith("dynamiccl_peer_bytes{")}
    assert sum(rows.values()) == 2 * want_bytes  # a send to rank 2 and a receive from rank 0 per op
    assert all('rank="1"' in k and ('peer="2"' in k) == ('direction="send"' in k) for k in rows), rows
    assert p.metrics.peer_records == 2 * len(ops) and not any(v for k, v in p.metrics.dropped.items() if "peer" in k)
    df = pl.read_parquet(tmp_path / "pq" / "peers" / "**" / "*.parquet")
    assert df["records"].sum() == 2 * len(ops) and df["bytes"].sum() == 2 * want_bytes
    assert (df["state0_s"] + df["state1_s"] + df["state2_s"]).min() > 0
