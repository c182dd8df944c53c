"""Fan-in with the detector: the central shard's regime changes against the single collector's on
the same records. Seeded; called by benchmarks/fanin.py (``--detect-nodes``), or alone.

Records: ``harness.scaleout_scenario.drop_then_straggler`` for N nodes × 8 ranks, one communicator.
Timeline ``full`` (65 s, detector warm-up 20 windows): one rank 2 ms late from 28 s to 38 s (a
straggler, then its recovery), every duration x2.5 from 50 s (a bandwidth drop); ``short`` (36 s,
warm-up 12): the same events at 16, 22 and 28 s, for 1,000 nodes on a small machine (with ``--rate``,
the instances per second, lowered from 150). Single-collector path:
every record through the collector's WindowAggregator into the product's Loop (detector). Scale-out
path: one real NodeCollector per node (its own records, default window and lateness) → its messages
→ a 3-server NATS JetStream cluster on loopback (stream R3) → a ShardRunner whose shard runs the same
Loop (``central.detector_loop``). Check: for every change the single path reports (recoveries
aside), the shard reports one of the same kind whose detection time is within 1 s, the straggler's
rank named first; and no change the single path does not report. ``--partitions P --comms C``: the
job's records on C communicators, split by communicator into P units on the scale-out path, their
changes through the job's combiner (scaleout/combiner.py), compared the same way. ``--retune`` (with
``--partitions``): the job's retuner (dry run) on the partitioned path — every partition's windows
forwarded in the notes, joined on partition 0's owner (scaleout/retuner_feed.py) — against the retuner
of the same job unpartitioned (P = 1, one shard in-process, the same node collectors' records): the same
decisions (audit lines less the change's id and magnitude, which are the combiner's), and the bytes the
forwarded windows add per window and partition.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.collector.component import FuncConsumer, RecordBatch  # noqa: E402
from dynamiccl.collector.config import WindowConfig  # noqa: E402
from dynamiccl.collector.processors.window_agg import WindowAggregator  # noqa: E402
from dynamiccl.collector.records import event_time_ns  # noqa: E402
from dynamiccl.detector.config import DetectorConfig  # noqa: E402
from dynamiccl.harness.scaleout_scenario import START_NS, Scenario, drop_then_straggler  # noqa: E402
from dynamiccl.loop import Loop  # noqa: E402
from dynamiccl.scaleout.bus import InProcessBus, Outbox  # noqa: E402
from dynamiccl.scaleout.central import CentralShard, detector_loop  # noqa: E402
from dynamiccl.scaleout.change_bus import ChangeHub  # noqa: E402
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, units  # noqa: E402
from dynamiccl.scaleout.nats_bus import loopback_cluster, publish  # noqa: E402
from dynamiccl.scaleout.node import NodeCollector, NodeConfig  # noqa: E402
from dynamiccl.scaleout.service import ShardRunner, connect  # noqa: E402

RANKS, JOB = 8, "det"
#: communicators for ``--comms`` (contracts.partition with P = 2: 0xA1, 0xA3 -> 0; 0xA2, 0xB1 -> 1)
COMMS = (0x1111_2222_3333_4444, 0xA1, 0xA2, 0xA3, 0xB1)
TOLERANCE_S = 1.0


@dataclass(frozen=True)
class Timeline:
    windows: int
    warmup: int            # the detector's baseline windows
    straggler_at_s: float
    straggler_until_s: float
    drop_at_s: float


TIMELINES = {"full": Timeline(65, 20, 28.0, 38.0, 50.0), "short": Timeline(36, 12, 16.0, 22.0, 28.0)}


class TimedDetector:
    """The product's detector, its process CPU time per window kept (where the time goes vs nodes)."""

    def __init__(self, detector):
        self.detector, self.cpu_s = detector, []

    def process(self, wf):
        t = time.process_time()
        out = self.detector.process(wf)
        self.cpu_s.append(time.process_time() - t)
        return out


def _config(tl: Timeline) -> DetectorConfig:
    return DetectorConfig().with_overrides({"baseline.warmup": tl.warmup, "autoencoder.enabled": False})


def single_changes(ev, nodes: int, tl: Timeline, slice_ns: int = 100_000_000) -> tuple[list, TimedDetector]:
    """One collector receiving every node's records as they come: ``slice_ns`` of each node's in turn
    (a node's whole run at once would close the windows before the other nodes' records arrive)."""
    changes: list = []
    det = TimedDetector(detector_loop(_config(tl))(JOB).detector)
    loop = Loop(det, sinks=[changes.append])
    agg = WindowAggregator(WindowConfig(window_s=1.0), next_consumer=FuncConsumer(lambda r: loop.step(r.features)))
    t = event_time_ns(ev)
    key = (t - t.min()) // slice_ns * nodes + ev["rank"] // RANKS
    order = np.argsort(key, kind="stable")
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    for part in np.split(order, bounds):
        agg.consume(RecordBatch(ev[part], host=f"n{int(ev['rank'][part[0]]) // RANKS}", job_id=JOB))
    agg.shutdown()
    return changes, det


def node_messages(ev, nodes: int, batch: int = 4096, partitions: int = 1) -> dict[int, list]:
    """{window: messages} of one real node collector per node over its own records."""
    out: dict[int, list] = {}
    order = np.argsort(ev["rank"] // RANKS, kind="stable")     # each node's records, in their order
    cuts = np.searchsorted((ev["rank"] // RANKS)[order], np.arange(1, nodes))
    for n, idx in enumerate(np.split(order, cuts)):
        bus = InProcessBus(max_messages=1 << 20)
        node = NodeCollector(NodeConfig(f"n{n}", JOB, partitions=partitions), Outbox(bus, max_messages=1 << 20))
        mine = ev[idx]
        for i in range(0, len(mine), batch):
            node.consume(mine[i:i + batch])
            node.tick()
        node.tick(flush_all=True)
        for m in bus.drain():
            out.setdefault(int(m.msg_id.split("/")[2]), []).append(m)
    return out


def _retuner(root: Path, name: str):
    """(make_retuner, its retuners, the audit path) of a dry-run retuner per job, audit log in ``root``."""
    from dynamiccl.retuner.config import RetunerConfig
    from dynamiccl.scaleout.retuning import CentralRetuning, retuner_factory
    retuners: dict = {}
    rt = CentralRetuning(RetunerConfig(), str(root / f"tuner-{name}-{{job}}.conf"), str(root / f"audit-{name}-{{job}}.jsonl"))
    return retuner_factory(rt.validate([JOB]), retuners, clock=lambda: 0.0), retuners, root / f"audit-{name}-{JOB}.jsonl"


def unpartitioned_audit(msgs: dict[int, list], nodes: int, tl: Timeline, root: Path) -> tuple[list[dict], list]:
    """The retuner's audit lines and the regime changes on the job unpartitioned (P = 1): one shard,
    in-process, every window."""
    import json
    make, retuners, path = _retuner(root, "p1")
    t, changes = [0.0], []
    cfg = MergerConfig({JOB: frozenset(f"n{n}" for n in range(nodes))})
    shard = CentralShard("s0", cfg, ShardTable(1.5, lambda: t[0]), {},
                         detector_loop(_config(tl), make_retuner=make, sinks=lambda u: [changes.append]), lambda: t[0])
    for w in sorted(msgs):
        for m in msgs[w]:
            shard.handle(m)
        t[0] += 0.5
        shard.poll()
    t[0] += cfg.max_lateness_s
    shard.poll()
    for jr in retuners.values():
        jr.close()
    return [json.loads(line) for line in path.read_text().splitlines()], changes


async def sharded_changes(urls, msgs: dict[int, list], nodes: int, tl: Timeline, timeout_s: float,
                          partitions: int = 1, retune: Path | None = None):
    """The shard's changes; with ``partitions`` > 1 each partition is a unit with its own loop, and
    their changes go through the job's combiner (in this process: the notes need no bus here).
    ``retune``: the job's retuner too (dry run, its audit log in that directory)."""
    nc, js = await connect(urls, replicas=3)
    changes: list = []
    clock = time.monotonic
    cfg = MergerConfig(units({JOB: frozenset(f"n{n}" for n in range(nodes))}, {JOB: partitions}))
    make, retuners, _ = _retuner(retune, f"p{partitions}") if retune is not None else (None, {}, None)
    hub = ChangeHub({JOB: partitions}, lambda u: True, clock, lambda job, c: changes.append(c),
                    retuner=make if partitions > 1 else None)
    inner = detector_loop(_config(tl), sinks=lambda u: [] if partitions > 1 else [changes.append], make_retuner=make)
    timed: list[TimedDetector] = []

    def make_loop(job: str):
        loop = inner(job)
        timed.append(TimedDetector(loop.detector))
        loop.detector = timed[-1]
        return loop
    shard = CentralShard("s0", cfg, ShardTable(1.5, clock), {}, make_loop, clock)
    runner = ShardRunner(shard, js, ack_wait_s=3.0)
    done = asyncio.Event()
    def on_steps(steps):
        hub.steps(steps)
        for subj, data in hub.outgoing():
            hub.receive(data, subj)
        hub.round()
    task = asyncio.create_task(runner.run(lambda: not done.is_set(), on_steps=on_steps))
    for w in sorted(msgs):                      # the nodes publish window by window, faster than real time
        await asyncio.gather(*(publish(js, m, 10.0) for m in msgs[w]))
        await asyncio.sleep(0.05)
    deadline = clock() + timeout_s
    while shard.counters["windows_run"] < len(msgs) * partitions and clock() < deadline:   # every unit's
        await asyncio.sleep(0.1)
    done.set()
    await task
    await nc.close()
    hub.close()
    for jr in retuners.values():
        jr.close()
    shard.counters.update({k: v for k, v in hub.counters.items() if k.startswith(("retuner_", "note"))})
    return changes, shard, timed


def _decisions(audit: list[dict]) -> list[dict]:
    """Audit lines less the change's magnitude (a partitioned job's is its first member partition's) and the
    wall time, the combiner's change ids (``rc-<job>-combined-N``) written as the detector's (``rc-<job>-N``)."""
    import re
    return [{k: re.sub(rf"rc-{JOB}-combined-(\d+)", rf"rc-{JOB}-\1", v) if isinstance(v, str) else v
             for k, v in a.items() if k not in ("magnitude", "ts")} for a in audit]


def compare(single: list, sharded: list) -> dict:
    """Each single-path change (recoveries aside) matched by a shard change of its kind within 1 s."""
    want = [c for c in single if c.kind != "recovery"]
    got = [c for c in sharded if c.kind != "recovery"]
    dts, named = [], True
    for c in want:
        same = [g for g in got if g.kind == c.kind]
        best = min(same, key=lambda g: abs(g.detected_s - c.detected_s), default=None)
        dts.append(abs(best.detected_s - c.detected_s) if best is not None else float("inf"))
        if c.kind == "straggler":
            named &= best is not None and best.ranks[:1] == c.ranks[:1]
    return {"kinds": sorted({c.kind for c in want}), "matched": sum(d <= TOLERANCE_S for d in dts), "wanted": len(want),
            "extra": max(0, len(got) - len(want)), "max_dt_s": max(dts, default=float("inf")), "straggler_named": named}


class Phases:
    """CPU and wall seconds of each named phase (where a 1,000-node run spends its time)."""

    def __init__(self):
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    def run(self, name: str, fn, *a):
        c, w = time.process_time(), time.monotonic()
        out = fn(*a)
        self.cpu[name], self.wall[name] = time.process_time() - c, time.monotonic() - w
        return out

    def line(self) -> str:
        return " ".join(f"{k}={self.cpu[k]:.1f}/{self.wall[k]:.1f}" for k in self.cpu)


def _per_window_ms(timed) -> str:
    """The detector's CPU per window, ms: median/max (total s)."""
    cpu = np.array([x for t in timed for x in t.cpu_s])
    return f"{1e3 * np.median(cpu):.1f}/{1e3 * cpu.max():.0f} ({cpu.sum():.1f} s)" if cpu.size else "-"


def detect_check(nodes: int, seed: int, root: Path, timeout_s: float = 300.0, timeline: str = "full",
                 rate: float = 150.0, slice_s: float = 0.1, partitions: int = 1, comms: int = 1,
                 retune: bool = False) -> dict:
    tl = TIMELINES[timeline]
    sc = Scenario(nranks=nodes * RANKS, nnodes=nodes, windows=tl.windows, rate_per_s=rate,
                  straggler=RANKS * (nodes // 2) + 3, straggler_at_s=tl.straggler_at_s,
                  straggler_until_s=tl.straggler_until_s, drop_at_s=tl.drop_at_s,
                  comm_hashes=COMMS[:comms])
    ph = Phases()
    ev = ph.run("records", drop_then_straggler, sc, seed)
    single, single_det = ph.run("single", single_changes, ev, nodes, tl, int(slice_s * 1e9))
    msgs = ph.run("nodes", node_messages, ev, nodes, 4096, partitions)
    whole = None
    if retune:
        whole = ph.run("retune_p1", unpartitioned_audit, node_messages(ev, nodes, 4096, 1), nodes, tl, root)
    n_records = len(ev)
    del ev
    cluster = loopback_cluster(root / "nats", 3)
    try:
        sharded, shard, timed = ph.run("sharded", lambda: asyncio.run(sharded_changes(
            cluster.urls, msgs, nodes, tl, timeout_s, partitions, root if retune else None)))
    finally:
        cluster.stop()
    res = compare(single, sharded)
    if whole is not None:
        import json
        whole, whole_changes = whole
        audit = root / f"audit-p{partitions}-{JOB}.jsonl"
        split = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
        joined = max(1, shard.counters.get("retuner_windows_joined", 0))
        res.update(decisions=len(split), decisions_p1=len(whole),
                   retune_same=int(_decisions(split) == _decisions(whole) and len(whole) > 0),
                   # the retuner can decide as P = 1's only on the same changes: whether the partitions'
                   # detectors and the combiner gave the job the unsplit job's changes (kind, onset, detection)
                   changes_same=int([(c.kind, c.start_s, c.detected_s) for c in sharded]
                                    == [(c.kind, c.start_s, c.detected_s) for c in whole_changes]),
                   retune_diff=next(((a, b) for a, b in zip(_decisions(split), _decisions(whole)) if a != b), None),
                   window_bytes=shard.counters.get("note_window_bytes", 0) / joined / partitions,
                   row_bytes=shard.counters.get("note_window_bytes", 0) / max(1, shard.counters.get("note_window_rows", 0)),
                   retuner_counters={k: v for k, v in shard.counters.items() if k.startswith("retuner_")})
    res.update(records=n_records, windows=len(msgs), windows_run=shard.counters["windows_run"],
               nodes_missing=shard.merger.counters["nodes_missing"], straggler=sc.straggler,
               single=[(c.kind, c.detected_s, c.ranks[:1]) for c in single],
               sharded=[(c.kind, c.detected_s, c.ranks[:1]) for c in sharded], phases=ph.line(),
               det_ms_single=_per_window_ms([single_det]), det_ms_shard=_per_window_ms(timed))
    # the check means something only when the single path saw both events: the straggler, by its
    # rank, and a change within 5 s of the drop (its kind is the detector's call: see the docs)
    t0 = START_NS / 1e9
    saw_straggler = any(c.kind == "straggler" and c.ranks[:1] == [sc.straggler] for c in single)
    saw_drop = any(c.kind != "recovery" and 0 <= c.detected_s - t0 - sc.drop_at_s <= 5 for c in single)
    res.update(saw_straggler=saw_straggler, saw_drop=saw_drop)
    res["pass"] = bool(saw_straggler and saw_drop and res["matched"] == res["wanted"] and res["extra"] == 0
                       and res["straggler_named"] and res["windows_run"] >= res["windows"] - 1
                       and res.get("retune_same", 1) == 1)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--timeline", choices=sorted(TIMELINES), default="full")
    ap.add_argument("--rate", type=float, default=150.0, help="collective instances per second (each: one record per rank)")
    ap.add_argument("--slice", type=float, default=0.1, dest="slice_s",
                    help="seconds of one node's records per batch into the single collector")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds the shard may take after the last publish")
    ap.add_argument("--partitions", type=int, default=1, help="split the job by communicator (scale-out path)")
    ap.add_argument("--comms", type=int, default=1, choices=range(1, len(COMMS) + 1),
                    help="communicators of the job (instances spread evenly over them)")
    ap.add_argument("--retune", action="store_true",
                    help="the job's retuner (dry run) on both paths: the partitioned one's decisions against P = 1's")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        r = detect_check(args.nodes, args.seed, Path(d), args.timeout, args.timeline, args.rate, args.slice_s,
                         args.partitions, args.comms, args.retune)
    retune = ""
    if args.retune:
        print(f"retuner counters: {r['retuner_counters']}\nfirst differing decision (partitioned, P = 1): "
              f"{r['retune_diff']}")
        retune = (f"decisions={r['decisions']}/{r['decisions_p1']} changes_same={r['changes_same']} "
                  f"retune_same={r['retune_same']} "
                  f"window_bytes_per_partition={r['window_bytes']:.0f} bytes_per_row={r['row_bytes']:.0f} ")
    print(f"single: {r['single']}\nsharded: {r['sharded']}\nphases cpu/wall s: {r['phases']}\n"
          f"detector cpu per window, median/max ms (total): single {r['det_ms_single']} shard {r['det_ms_shard']}; "
          f"load {os.getloadavg()}")
    print(f"nodes={args.nodes} partitions={args.partitions} comms={args.comms} timeline={args.timeline} "
          f"rate={args.rate:g} records={r['records']} "
          f"windows_run={r['windows_run']}/{r['windows']} "
          f"kinds={','.join(r['kinds'])} saw_straggler={int(r['saw_straggler'])} saw_drop={int(r['saw_drop'])} matched={r['matched']}/{r['wanted']} extra={r['extra']} "
          f"max_dt_s={r['max_dt_s']:.2f} straggler_named={int(r['straggler_named'])} {retune}pass={int(r['pass'])}")
    return 0 if r["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
