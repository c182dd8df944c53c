"""The applied tuner config over the bus: from the central retuner's push to every node's file.

Seeded. A NATS JetStream cluster on loopback (``--servers``, stream replicas = servers) with the users of
``dynamiccl nats-auth`` (one per node and the shard); N simulated nodes in this process, each with its
own connection and user, its own :class:`TunerSink` and file, subscribed as ``dynamiccl node
--tuner-config`` is; the central side a real ``ConfigPusher`` (what the retuner calls when it applies),
``TunerMirror`` and ``TunerPublisher``. ``--versions`` versions of ``--rules`` random rules each are
pushed and published one after the other; for each, the time from the push to the last node's file
holding it. Then a node started afterwards reads the latest with one direct get.

Nodes share this process and its event loop, so their checks and writes (each with an fsync) are
serialised here, unlike on N machines, where each node does only its own: the delay to the *first*
node's file (the bus plus one node's work) is what a real cluster's nodes see, the delay to the last one
here adds the N-1 others' work (reported, with a node's work per version, ``node_ms``).

Check (``pass=1``): every node wrote every version (none refused, none missed), every file ends equal
byte for byte to the central's, the late node got the latest, and the first node's delay stays within
``--limit`` for every version (1 s: a retuner decides at most once a window).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.nccl_tuner_plugin.config import FUNCS, Rule  # noqa: E402
from dynamiccl.retuner.push import ConfigPusher  # noqa: E402
from dynamiccl.scaleout.auth import AUTH_CONF, load_credentials, write_auth  # noqa: E402
from dynamiccl.scaleout.nats_bus import loopback_cluster  # noqa: E402
from dynamiccl.scaleout.tuner_bus import TunerSink, ensure_tuner_stream, fetch_latest, stored_subject  # noqa: E402
from dynamiccl.scaleout.tuner_publish import TunerMirror, TunerPublisher  # noqa: E402

ALGO_PROTO = [("RING", "LL"), ("RING", "LL128"), ("RING", "SIMPLE"), ("TREE", "LL"), ("TREE", "SIMPLE")]


def random_rules(rng: random.Random, n: int) -> list[Rule]:
    out = []
    for _ in range(n):
        lo = rng.randrange(0, 1 << 30)
        algo, proto = rng.choice(ALGO_PROTO)
        out.append(Rule(rng.choice(sorted(FUNCS)), lo, lo + rng.randrange(1, 1 << 24), algo, proto,
                        rng.choice([0, 4, 8, 16]), 0, rng.choice([None, rng.getrandbits(64)])))
    return out


async def _connect(urls, creds):
    import nats
    return await nats.connect(servers=urls, **load_credentials(creds).connect_kwargs())


async def run(args, root: Path) -> dict:
    nodes = [f"n{i}" for i in range(args.nodes)]
    files = write_auth(root / "auth", {"j": frozenset(nodes + ["late"])}, ["s0"])
    cluster = loopback_cluster(root / "nats", args.servers, config=root / "auth" / AUTH_CONF)
    try:
        return await _measure(args, root, nodes, files, cluster.urls)
    finally:
        cluster.stop()


async def _measure(args, root, nodes, files, urls) -> dict:
    rng = random.Random(args.seed)
    sc = await _connect(urls, files["shard.s0"])
    js = sc.jetstream(timeout=5.0)
    await ensure_tuner_stream(js, replicas=args.servers)
    counters: dict = {}
    mirror = TunerMirror(["j"], counters)
    await mirror.start(sc, js)
    publisher = TunerPublisher(js, counters, mirror, timeout_s=5.0)
    pusher = ConfigPusher(root / "central.conf", dry_run=False)
    conns, sinks, written_at, work = [], [], {}, []
    for n in nodes:
        (root / n).mkdir()
        sink = TunerSink("j", str(root / n / "tuner.conf"), {})
        nc = await _connect(urls, files[f"node.j.{n}"])

        async def deliver(m, sink=sink, n=n):
            t = time.monotonic()
            if sink.offer(stored_subject(m.subject, m.headers)[0], m.headers, m.data) == "written":
                written_at[(n, sink.version)] = time.monotonic()
                work.append(written_at[(n, sink.version)] - t)
        await nc.subscribe(sink.live, cb=deliver)        # the stream's republish, as dynamiccl node does
        await nc.flush()
        conns.append(nc)
        sinks.append(sink)
    delays, firsts, sizes = [], [], []
    cpu0 = time.process_time()
    for _ in range(args.versions):
        t0 = time.monotonic()
        v = pusher.push(random_rules(rng, args.rules))
        await publisher.publish_due({"j": pusher})
        sizes.append((root / "central.conf").stat().st_size)
        for _ in range(1000):                       # bounded: 10 s
            if all(s.version >= v for s in sinks):
                break
            await asyncio.sleep(0.01)
        got = [written_at.get((n, v)) for n in nodes]
        complete = all(t is not None for t in got)
        delays.append(max(t - t0 for t in got) if complete else float("inf"))
        firsts.append(min(t - t0 for t in got if t is not None) if any(got) else float("inf"))
        await asyncio.sleep(args.pause)
    cpu = time.process_time() - cpu0
    (root / "late").mkdir()
    late = TunerSink("j", str(root / "late" / "tuner.conf"), {})
    lc = await _connect(urls, files["node.j.late"])
    late_status = await fetch_latest(lc.jetstream(), late)
    want = (root / "central.conf").read_bytes()
    identical = sum((root / n / "tuner.conf").read_bytes() == want for n in nodes)
    refused = sum(v for s in sinks for k, v in s.counters.items() if k.startswith("tuner_refused_"))
    for c in [*conns, sc, lc]:
        await c.close()
    delays.sort()
    firsts.sort()
    work.sort()
    every = all(d < float("inf") for d in delays)
    return dict(versions=len(delays), p50=delays[len(delays) // 2], max=delays[-1], first_max=firsts[-1],
                first_p50=firsts[len(firsts) // 2], bytes=sum(sizes) // len(sizes), identical=identical,
                refused=refused, late=late_status, published=counters["tuner_published"],
                node_ms=1e3 * work[len(work) // 2] if work else float("nan"), cpu_per_version_ms=1e3 * cpu / len(delays),
                passed=every and firsts[-1] <= args.limit and identical == len(nodes) and refused == 0
                and late_status == "written" and counters["tuner_published"] == args.versions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--servers", type=int, default=3, help="NATS servers on loopback (stream replicas too)")
    ap.add_argument("--versions", type=int, default=20)
    ap.add_argument("--rules", type=int, default=64, help="rules per version (the plugin holds at most 256)")
    ap.add_argument("--pause", type=float, default=0.1, help="s between versions")
    ap.add_argument("--limit", type=float, default=1.0, help="s the first node may take per version")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        r = asyncio.run(run(args, Path(d)))
    line = {"nodes": args.nodes, "servers": args.servers, "versions": r["versions"], "rules": args.rules,
            "file_bytes": r["bytes"], "first_node_p50_s": f"{r['first_p50']:.3f}",
            "first_node_max_s": f"{r['first_max']:.3f}", "node_ms_p50": f"{r['node_ms']:.1f}",
            "all_nodes_in_process_p50_s": f"{r['p50']:.3f}", "all_nodes_in_process_max_s": f"{r['max']:.3f}",
            "cpu_ms_per_version": f"{r['cpu_per_version_ms']:.1f}", "identical": f"{r['identical']}/{args.nodes}",
            "refused": r["refused"], "late": r["late"], "published": r["published"], "pass": int(r["passed"])}
    print(f"load {os.getloadavg()}")
    print(" ".join(f"{k}={v}" for k, v in line.items()))
    return 0 if r["passed"] else 1

if __name__ == "__main__":
    sys.exit(main())
