"""Fan-in of one job split by communicator: the central tier's merge CPU per window for one partition
against the whole job's, on the same records in the same run. Seeded.

N nodes × 8 ranks of one job, ``--comms`` communicators; every node's real ``NodeCollector`` builds its
partials twice, whole (P = 1) and split (``--partitions`` P), and the central merger
(``WindowMerger``: inflate each message, merge the window, build its ``WindowFeatures``; no detector)
merges each window of the whole job, then each window of each partition. Reported per window: the
whole job's merge CPU, the largest partition's, their ratio (what one shard owning one partition
carries against one shard owning the job), the partitions' sum against the whole (the overhead of
splitting), the largest partition's share of the records (the hash spreads communicators, not
records: with few communicators the partitions are uneven), and the node side's extra messages. Check: every partition's merged records add up to the
whole job's, and the largest partition costs at most ``--limit`` of the whole.

    python benchmarks/fanin_partitions.py --nodes 200 --partitions 4
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.harness.collector_testing import synthetic_events  # noqa: E402
from dynamiccl.scaleout.bus import InProcessBus, Outbox  # noqa: E402
from dynamiccl.scaleout.merger import MergerConfig, WindowMerger, units  # noqa: E402
from dynamiccl.scaleout.node import NodeCollector, NodeConfig  # noqa: E402
from dynamiccl.scaleout.wire import read_partial  # noqa: E402

RANKS, JOB = 8, "big"


def node_messages(ev, nodes: int, partitions: int) -> list:
    out = []
    node_of = ev["rank"] // RANKS
    for n in range(nodes):
        bus = InProcessBus(max_messages=1 << 20)
        node = NodeCollector(NodeConfig(f"n{n}", JOB, partitions=partitions), Outbox(bus, max_messages=1 << 20))
        node.consume(ev[node_of == n])
        node.tick(flush_all=True)
        out.extend(bus.drain())
    return out


def merge_cpu(msgs: list, nodes: int, partitions: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """{unit: CPU s per window} and {unit: records merged}: each unit's windows merged on their own."""
    expected = units({JOB: frozenset(f"n{n}" for n in range(nodes))}, {JOB: partitions})
    by_unit: dict[str, dict[int, list]] = {}
    for m in msgs:
        u, _, w = m.msg_id.split("/")[:3]
        by_unit.setdefault(u, {}).setdefault(int(w), []).append(m.data)
    cpu: dict[str, list[float]] = {}
    records: dict[str, int] = {}
    for u, wins in sorted(by_unit.items()):
        now = [0.0]
        merger = WindowMerger(MergerConfig({u: expected[u]}), clock=lambda: now[0])
        for w in sorted(wins):
            t = time.process_time()
            for data in wins[w]:
                merger.add(u, read_partial(data))
            due = merger.due()
            if len(wins[w]) == len(expected[u]):     # timed: windows every node reported (they merge at once)
                cpu.setdefault(u, []).append(time.process_time() - t)
            records[u] = records.get(u, 0) + sum(int(wf.keys["records"].sum()) for _, wf in due)
        now[0] = 1e9                                  # the rest (a node without records there) past the lateness
        records[u] = records.get(u, 0) + sum(int(wf.keys["records"].sum()) for _, wf in merger.due())
    return cpu, records


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--comms", type=int, default=16, help="communicators of the job")
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--rate", type=float, default=150.0, help="collective instances per second")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--limit", type=float, default=None,
                    help="pass if the largest partition's merge CPU is at most this fraction of the whole's "
                         "(default 1.5 / partitions)")
    args = ap.parse_args()
    limit = args.limit if args.limit is not None else 1.5 / args.partitions
    rng = np.random.default_rng(args.seed)
    comms = tuple(int(c) for c in rng.integers(1, 1 << 62, args.comms))
    ev = synthetic_events(int(args.rate * args.windows), nranks=args.nodes * RANKS, nnodes=args.nodes, seed=args.seed,
                          rate_per_s=args.rate, comm_hashes=comms, funcs=("AllReduce", "AllGather"), log2_bytes=(16, 24))
    whole_msgs = node_messages(ev, args.nodes, 1)
    split_msgs = node_messages(ev, args.nodes, args.partitions)
    whole_cpu, whole_rec = merge_cpu(whole_msgs, args.nodes, 1)
    split_cpu, split_rec = merge_cpu(split_msgs, args.nodes, args.partitions)
    whole = float(np.median(whole_cpu[JOB]))
    per_part = {u: float(np.median(c)) for u, c in split_cpu.items()}
    largest = max(per_part.values())
    share = max(split_rec.values()) / max(whole_rec[JOB], 1)     # the largest partition's share of the records
    ratio, overhead = largest / whole, sum(per_part.values()) / whole
    exact = sum(split_rec.values()) == whole_rec[JOB] == len(ev)
    load = os.getloadavg()
    print(f"records {len(ev)} nodes {args.nodes} comms {args.comms} windows {args.windows}; load {load}")
    print(f"merge CPU per window, median ms: whole {1e3 * whole:.1f}; partitions "
          + ", ".join(f"{u} {1e3 * c:.1f}" for u, c in sorted(per_part.items())))
    print(f"messages: whole {len(whole_msgs)} split {len(split_msgs)}; bytes whole {sum(len(m.data) for m in whole_msgs)} "
          f"split {sum(len(m.data) for m in split_msgs)}")
    ok = exact and ratio <= limit
    print(f"nodes={args.nodes} partitions={args.partitions} comms={args.comms} whole_ms={1e3 * whole:.1f} "
          f"largest_partition_ms={1e3 * largest:.1f} ratio={ratio:.3f} limit={limit:.3f} largest_share={share:.3f} "
          f"sum_ratio={overhead:.2f} "
          f"msgs_ratio={len(split_msgs) / len(whole_msgs):.1f} records_exact={int(exact)} load1={load[0]:.1f} pass={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
