"""Node collector throughput on one core: the plugin's frames decoded (the collector's StreamDecoder)
and aggregated into node partials (``scaleout.node.NodeCollector``: windows closed, partials encoded
and handed to an in-process bus). Seeded, no network.

Baseline, in the same run over the same frames: the single collector (StreamDecoder + the
collector's WindowAggregator), the path a job without node collectors runs. Rates are records per
CPU second of this process (one thread does the work; on a busy machine CPU seconds still measure
this code, not the neighbours); each path runs twice and the second ("steady") run is judged.
Last line key=value; pass=1 when the node collector decodes and aggregates >= --target records per
CPU second and every record reached a partial. At this density a window's partial is over the bus's
1 MiB message limit and goes in parts (``split_partials``), included in the cost.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.collector.component import RecordBatch  # noqa: E402
from dynamiccl.collector.config import WindowConfig  # noqa: E402
from dynamiccl.collector.decode import StreamDecoder  # noqa: E402
from dynamiccl.collector.processors.window_agg import WindowAggregator  # noqa: E402
from dynamiccl.harness.collector_testing import (NopConsumer, encode_frame, encode_frames, process_record,  # noqa: E402
                                                 synthetic_events)
from dynamiccl.scaleout.bus import InProcessBus, Outbox  # noqa: E402
from dynamiccl.scaleout.node import NodeCollector, NodeConfig  # noqa: E402


#: the workload of benchmarks/collector_throughput.py (the single collector's 2 M records/s figure):
#: records, ranks, records per second of event time, records per frame, bytes per read, seed; and the
#: target in records per CPU second
WORKLOAD = (("--records", int, 4_000_000), ("--nranks", int, 8), ("--rate", float, 2e6), ("--frame", int, 1024),
            ("--chunk", int, 1 << 20), ("--seed", int, 0), ("--target", float, 2e6))


def streams_of(ev, nranks: int, per_frame: int) -> list[bytes]:
    """One stream per rank, as the plugin sends them."""
    return [encode_frame(process_record("node0", "bench", 1000 + r)) + encode_frames(ev[ev["rank"] == r], per_frame=per_frame)
            for r in range(nranks)]


def drive(streams: list[bytes], chunk: int, sink) -> int:
    """Round-robin over the per-rank streams, one chunk each (like the receiver's selector loop)."""
    decs, pos, decoded, active = [StreamDecoder() for _ in streams], [0] * len(streams), 0, True
    while active:
        active = False
        for i, s in enumerate(streams):
            if pos[i] >= len(s):
                continue
            active = True
            res = decs[i].feed(memoryview(s)[pos[i]:pos[i] + chunk])
            pos[i] += res.consumed
            if res.events is not None:
                decoded += len(res.events)
                sink(res.events, decs[i])
    return decoded


def single_collector(streams, chunk) -> tuple[float, int]:
    agg = WindowAggregator(WindowConfig(window_s=1.0), next_consumer=NopConsumer())
    c = time.process_time()
    n = drive(streams, chunk, lambda ev, d: agg.consume(RecordBatch(ev, d.host, d.job_id, d.comm_names)))
    agg.shutdown()
    return time.process_time() - c, n


def node_collector(streams, chunk) -> tuple[float, int, NodeCollector]:
    node = NodeCollector(NodeConfig("node0", "bench"), Outbox(InProcessBus(), max_messages=1 << 20))

    def sink(ev, _d):
        node.consume(ev)
        node.tick()
    c = time.process_time()
    n = drive(streams, chunk, sink)
    node.tick(flush_all=True)
    return time.process_time() - c, n, node


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default in WORKLOAD:
        ap.add_argument(flag, type=kind, default=default)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    ev = synthetic_events(args.records // args.nranks, nranks=args.nranks, seed=args.seed,
                          rate_per_s=args.rate / args.nranks)
    streams = streams_of(ev, args.nranks, args.frame)
    single_collector(streams, args.chunk)                 # cold runs: first-touch page faults
    node_collector(streams, args.chunk)
    c_single, n1 = single_collector(streams, args.chunk)
    c_node, n2, node = node_collector(streams, args.chunk)
    ok_count = n1 == n2 == len(ev) and node.counters["aggregated"] == len(ev)
    single_rps, node_rps = n1 / c_single, n2 / c_node
    print(f"records={len(ev)} ranks={args.nranks} frames_of={args.frame} windows={node.counters['windows']} "
          f"messages={node.outbox.counters['emitted']} split_partials={node.counters['split_partials']} bytes_upstream={node.outbox.counters['bytes_emitted']}")
    print(f"single collector (decode + WindowAggregator): {single_rps / 1e6:6.2f} M records per CPU s")
    print(f"node collector (decode + partials + encode)  : {node_rps / 1e6:6.2f} M records per CPU s  "
          f"ratio {node_rps / single_rps:.2f}; load {os.getloadavg()}")
    ok = ok_count and node_rps >= args.target
    print(f"records={len(ev)} single_cpu_rps={single_rps:.0f} node_cpu_rps={node_rps:.0f} "
          f"ratio_vs_single={node_rps / single_rps:.3f} all_aggregated={int(ok_count)} target_rps={args.target:.0f} "
          f"pass={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
