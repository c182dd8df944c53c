"""Fan-in: node partials of N nodes × 8 ranks through a 3-server NATS JetStream cluster (loopback,
stream replicated 3×) into 2 central shards; faults on the way. Seeded.

Node side, measured on one real node collector (8 ranks, 550 records/s each = 4,400 records/s):
its CPU share of one core (process time / data seconds) and its upstream bytes per second. The N
nodes' partials are that node's, relabelled per node (ranks node*8..node*8+7; one node carries a
straggler rank from window --straggler-from), as the issue allows (replaying pre-computed partials).

Central side: two jobs of N/2 nodes (names chosen so rendezvous hashing gives each shard one job);
the two shards are separate processes that share ownership and checkpoints only through the JetStream
key-value bucket, as two `dynamiccl central` machines do (benchmarks/fanin_shards.py; the victim dies
by SIGKILL); ``--one-process``: both in this process over one table (sessions 8-11).
Faults: one NATS server killed after window --kill-server-after, the shard of the straggler's job
killed after window --kill-shard-after (its job moves to the other shard), node N/2+1 (in the other job) silent in
the last window. Checks: every window of every job run exactly once, with every node except the silent one
(nothing lost), the silent node counted missing, the straggler's global rank named in every window
after its onset, upstream ≤ 20 KB/s per node, node CPU ≤ 5 % of a core. Last line key=value pass=0|1.

Detector (``--detect-nodes``, benchmarks/fanin_detect.py): a second cluster, real node collectors'
partials of a straggler and a bandwidth-drop scenario, one shard running the product's detector
Loop: each change the single collector reports on the same records is reported within 1 s, the
straggler's rank named. (The 1,000-node replay above has too few windows for the detector's warm-up;
the detector check at 1,000 nodes: ``fanin_detect.py --nodes 1000 --timeline short --rate 30 --slice 1``.)
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import nats  # noqa: E402
import polars as pl  # noqa: E402

from dynamiccl.collector.records import event_time_ns  # noqa: E402
from dynamiccl.harness.collector_testing import synthetic_events  # noqa: E402
from dynamiccl.scaleout.bus import InProcessBus, Message, Outbox, msg_id, subject  # noqa: E402
from dynamiccl.scaleout.central import CentralShard  # noqa: E402
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, owner  # noqa: E402
from dynamiccl.scaleout.nats_bus import ensure_stream, loopback_cluster, publish  # noqa: E402
from dynamiccl.scaleout.node import NodeCollector, NodeConfig  # noqa: E402
from dynamiccl.scaleout.partials import node_partial  # noqa: E402
from dynamiccl.scaleout.service import ShardRunner  # noqa: E402
from dynamiccl.scaleout.wire import encode_partial  # noqa: E402
from fanin_detect import detect_check  # noqa: E402
from fanin_shards import ProcessShards  # noqa: E402

RANKS, RATE = 8, 550.0
SHARDS = ("s0", "s1")


def node_side(windows: int, seed: int):
    """One real node collector over `windows` s of 8 ranks × 550 records/s: (cpu %, bytes/s)."""
    ev = synthetic_events(int(RATE * windows), nranks=RANKS, seed=seed, rate_per_s=RATE)
    node = NodeCollector(NodeConfig("n0", "j"), Outbox(InProcessBus()))
    t0 = time.process_time()
    for i in range(0, len(ev), 440):            # 0.1 s of records per batch
        node.consume(ev[i:i + 440])
        node.tick()
    node.tick(flush_all=True)
    cpu = time.process_time() - t0
    span = (int(event_time_ns(ev).max()) - int(event_time_ns(ev).min())) / 1e9
    return 100 * cpu / span, node.outbox.counters["bytes_emitted"] / span, len(ev) / span


def templates(windows: int, seed: int, straggler: int):
    """Per window: a normal node's partial and a straggling node's (same instances)."""
    kw = dict(nranks=RANKS, seed=seed, rate_per_s=RATE, log2_bytes=(16, 24))
    out = []
    n = int(RATE * (windows + 2))              # the first window is a sliver (CPU-timed enqueue < start)
    for ev in (synthetic_events(n, **kw), synthetic_events(n, straggler_rank=straggler, **kw)):
        w = event_time_ns(ev) // 1_000_000_000
        wins = sorted(set(w.tolist()))[1:windows + 1]
        out.append({win: node_partial(ev[w == win], node="t", job_id="t", window=win, window_s=1.0) for win in wins})
    return out


def relabel(p, node: int, nodes: int) -> dict:
    off = node * RANKS
    q = dict(p, node=f"n{node}")
    q["keys"] = p["keys"].with_columns(pl.lit(nodes * RANKS, pl.Int32).alias("nranks"),
                                       pl.lit(nodes, pl.Int32).alias("nnodes"))
    q["inst"] = p["inst"].with_columns(pl.lit(nodes * RANKS, pl.Int32).alias("nranks"),
                                       pl.col("min_rank") + off)
    q["ranks"] = p["ranks"].with_columns(pl.col("rank") + off)
    return q


def job_names():
    for i in range(1000):
        a, b = f"a{i}", f"b{i}"
        if owner(a, list(SHARDS)) != owner(b, list(SHARDS)):
            return a, b
    raise RuntimeError("no job pair split over the shards")


class Recorder:
    """The shard's loop stand-in: records each window it is given (the straggler's top rank)."""

    def __init__(self, log, job):
        self.log, self.job = log, job

    def step(self, wf):
        top = (wf.ranks.sort(["shortest_count", "rank"], descending=[True, False])["rank"][0]
               if len(wf.ranks) else None)
        self.log.append((self.job, round(wf.window_start), wf.counters["nodes_reported"], top, time.monotonic()))

        class S:
            changes: list = []
        return S()


async def _publish_all(urls, msgs_by_window, go, published):
    nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    for i, (w, msgs) in enumerate(sorted(msgs_by_window.items())):
        while not go.is_set():                  # the parent holds the nodes while it waits to kill a shard
            await asyncio.sleep(0.05)
        t0 = time.monotonic()
        for k in range(0, len(msgs), 250):
            await asyncio.gather(*(publish(js, m, 10.0) for m in msgs[k:k + 250]))
        published.put((i, w, len(msgs)))
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))   # one window per second
    await nc.close()


def _publisher(urls, msgs_by_window, go, published):
    """The nodes: their own process (the nodes are other machines; their publishing must not take
    the central shards' event loop), one window of every node's partial per second."""
    asyncio.run(_publish_all(urls, msgs_by_window, go, published))


async def _next_published(q, proc):
    while True:
        try:
            return q.get_nowait()
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"publisher exited ({proc.exitcode})") from None
            await asyncio.sleep(0.02)


class InProcessShards:
    """Both shards in this process, over one ``ShardTable`` and one checkpoint dict (``--one-process``;
    the interface of :class:`fanin_shards.ProcessShards`)."""

    def __init__(self, js, cfg: MergerConfig):
        self.table, ckpt, self.log, self.alive = ShardTable(1.5, time.monotonic), {}, [], {s: True for s in SHARDS}
        self.shards = {s: CentralShard(s, cfg, self.table, ckpt, lambda job: Recorder(self.log, job), time.monotonic)
                       for s in SHARDS}
        # ack_wait 1 s: a dead shard's held partials are redelivered to the next owner 1 s after their
        # deadline was last extended
        self.runners = {s: ShardRunner(self.shards[s], js, ack_wait_s=1.0) for s in SHARDS}
        self.tasks = {s: asyncio.create_task(self.runners[s].run(lambda s=s: self.alive[s])) for s in SHARDS}

    def ready(self) -> bool:
        return self.table.live() == sorted(SHARDS)

    def check(self) -> None:
        for s, t in self.tasks.items():
            if t.done() and t.exception():
                raise RuntimeError(f"shard {s} failed") from t.exception()

    def kill(self, name: str) -> None:
        self.alive[name] = False

    async def finish(self) -> None:
        for s in SHARDS:
            self.alive[s] = False
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)

    @property
    def counters(self) -> dict:
        return {s: {**sh.counters, **sh.merger.counters,
                    "consumer_errors": sum(c.fetch_errors for c in self.runners[s].consumers.values())}
                for s, sh in self.shards.items()}


async def central(args, nwin, jobs, nodes_of, cluster, pub, go, published):
    nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    await ensure_stream(js, replicas=3)
    cfg = MergerConfig({j: frozenset(nodes_of[j]) for j in jobs}, lateness_s=args.lateness)
    shards = (InProcessShards(js, cfg) if args.one_process
              else ProcessShards(SHARDS, cluster.urls, cfg.expected_nodes, args.lateness).start())
    while not shards.ready():                         # both shards up (each sees the other) before the first partial
        await asyncio.sleep(0.05)
    go.set()
    victim = owner(jobs[0], list(SHARDS))
    t_kill_shard = None
    sent = 0
    for _ in range(nwin):
        i, w, n = await _next_published(published, pub)
        shards.check()
        sent += n
        if i == args.kill_server_after:
            cluster.kill(1)
        if i == args.kill_shard_after:
            # hold the nodes until the victim has run this window, so windows remain for its successor
            # (a victim stalled by the server kill would otherwise catch up on every window first)
            go.clear()
            until = time.monotonic() + 30
            while not any(j == jobs[0] and lw == w for j, lw, *_ in shards.log) and time.monotonic() < until:
                await asyncio.sleep(0.05)
                shards.check()
            shards.kill(victim)
            t_kill_shard = time.monotonic()
            go.set()
    deadline = time.monotonic() + cfg.max_lateness_s + 15   # the silent node's last window waits max_lateness_s
    want = nwin * len(jobs)
    while len({(j, w) for j, w, *_ in shards.log}) < want and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        shards.check()
    await shards.finish()
    await nc.close()
    if os.environ.get("FANIN_DEBUG") and t_kill_shard is not None:
        print("ownership changes (s after the shard kill):",
              [(s, j, o, round(t - t_kill_shard, 2)) for s, j, o, t in getattr(shards, "ownership", [])])
    return shards.log, shards.counters, sent, victim, t_kill_shard


def run_central(args, msgs_by_window, jobs, nodes_of, root):
    cluster = loopback_cluster(root, 3)
    ctx = mp.get_context("fork")                # the child inherits the prepared partials, no pickling
    go, published = ctx.Event(), ctx.Queue()
    pub = ctx.Process(target=_publisher, args=(cluster.urls, msgs_by_window, go, published), daemon=True)
    pub.start()
    try:
        return asyncio.run(central(args, len(msgs_by_window), jobs, nodes_of, cluster, pub, go, published))
    finally:
        pub.join(timeout=10)
        if pub.is_alive():
            pub.kill()
        cluster.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lateness", type=float, default=2.0)
    ap.add_argument("--straggler-from", type=int, default=2)
    ap.add_argument("--kill-server-after", type=int, default=3)
    ap.add_argument("--kill-shard-after", type=int, default=4)
    ap.add_argument("--one-process", action="store_true",
                    help="both shards in this process over one table (sessions 8-11); default: two processes "
                         "sharing ownership and checkpoints only through the key-value bucket")
    ap.add_argument("--detect-nodes", type=int, default=16, help="nodes of the detector check (0: skip it)")
    ap.add_argument("--detect-timeline", choices=("full", "short"), default="full",
                    help="the detector check's scenario (fanin_detect.py --timeline)")
    ap.add_argument("--detect-rate", type=float, default=150.0, help="its instances per second (fanin_detect.py --rate)")
    args = ap.parse_args()
    cpu_pct, bps, rps = node_side(10, args.seed)
    print(f"node collector: {rps:.0f} records/s, cpu {cpu_pct:.2f} % of a core, upstream {bps / 1e3:.1f} KB/s; "
          f"load {os.getloadavg()}", flush=True)
    normal, slow = templates(args.windows, args.seed, straggler=3)
    jobs = job_names()
    half = args.nodes // 2
    nodes_of = {jobs[0]: [f"n{i}" for i in range(half)], jobs[1]: [f"n{i}" for i in range(half, args.nodes)]}
    strag_node, silent = min(7, half - 1), half + 1  # straggler in jobs[0], silent node in jobs[1]
    wins = sorted(normal)
    t0 = time.process_time()
    msgs = {}
    for k, win in enumerate(wins):
        msgs[win] = []
        for n in range(args.nodes):
            job = jobs[0] if n < half else jobs[1]
            if n == silent and k == len(wins) - 1:
                continue
            tpl = slow if (n == strag_node and k >= args.straggler_from) else normal
            p = relabel(tpl[win], n % half, half)
            p["node"] = f"n{n}"
            msgs[win].append(Message(subject(job, f"n{n}"), encode_partial(p, job), msg_id(job, f"n{n}", win)))
    print(f"prepared {sum(map(len, msgs.values()))} partials in {time.process_time() - t0:.1f} cpu s", flush=True)
    with tempfile.TemporaryDirectory() as d:
        log, counters, sent, victim, t_kill = run_central(args, msgs, jobs, nodes_of, Path(d))
    runs = [(j, w) for j, w, *_ in log]
    if os.environ.get("FANIN_DEBUG"):
        print(sorted(log), wins, jobs, counters)
        print("t_kill", t_kill, "windows with nodes missing:", [(j, w, n, round(t - (t_kill or t), 2)) for j, w, n, _, t in sorted(log)
                                                          if n < half - (j == jobs[1] and w == wins[-1])])
    every_once = sorted(runs) == sorted((j, w) for j in jobs for w in wins)
    full = all(n == half - (j == jobs[1] and w == wins[-1]) for j, w, n, *_ in log)
    strag_rank = strag_node * RANKS + 3
    named = all(top == strag_rank for j, w, n, top, _ in log if j == jobs[0] and w >= wins[args.straggler_from])
    missing = sum(c.get("nodes_missing", 0) for c in counters.values())
    after = [t for j, w, *_, t in log if j == jobs[0] and t_kill is not None and t > t_kill]
    takeover = (min(after) - t_kill) if after else float("inf")
    det = {"pass": True, "max_dt_s": float("nan"), "matched": 0, "wanted": 0}
    if args.detect_nodes:
        with tempfile.TemporaryDirectory() as d:
            det = detect_check(args.detect_nodes, args.seed, Path(d), timeline=args.detect_timeline,
                               rate=args.detect_rate, slice_s=0.1 if args.detect_nodes <= 100 else 1.0)
        print(f"detector, {args.detect_nodes} nodes: single {det['single']} sharded {det['sharded']}", flush=True)
    ok = every_once and full and named and missing == 1 and bps <= 20e3 and cpu_pct <= 5.0 and det["pass"]
    print(f"windows run {len(runs)} of {len(jobs) * len(wins)} (each once: {every_once}); full windows: {full}; "
          f"straggler rank {strag_rank} named: {named}; nodes missing {missing} (expected 1); "
          f"shard {victim} killed, its job's next window run {takeover:.2f} s later; load {os.getloadavg()}")
    print(f"nodes={args.nodes} shard_processes={int(not args.one_process)} windows={len(wins)} partials_sent={sent} runs={len(runs)} each_once={int(every_once)} "
          f"nothing_lost={int(full)} straggler_named={int(named)} missing_nodes={missing} takeover_s={takeover:.2f} "
          f"node_cpu_pct={cpu_pct:.2f} upstream_Bps={bps:.0f} detect_nodes={args.detect_nodes} "
          f"detect_matched={det['matched']}/{det['wanted']} detect_max_dt_s={det['max_dt_s']:.2f} "
          f"detect_pass={int(det['pass'])} pass={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
