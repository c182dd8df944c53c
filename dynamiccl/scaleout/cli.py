"""``dynamiccl node`` (node collector: the plugin's Unix socket in, partials to NATS JetStream out) and
``dynamiccl central`` (a shard: partials from NATS, merged windows through the detector loop,
/metrics). Configuration is validated at start-up: a bad value prints one line naming it and exits 2.
docs/scale-out.md has a two-node example on loopback.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from dataclasses import replace

__all__ = ["register", "node_config", "central_config", "main_node", "main_central", "main_auth"]

log = logging.getLogger("scaleout")
_OFF = ("off", "none", "")


def _nats_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", action="append", default=None, metavar="URL",
                   help="NATS server (repeat for a cluster; default nats://127.0.0.1:4222)")
    p.add_argument("--replicas", type=int, default=1, help="partials stream replicas (3 on a 3-server cluster)")
    p.add_argument("--metrics", default="off", metavar="HOST:PORT", help="/metrics address ('off': none)")
    p.add_argument("--credentials", default=None, metavar="PATH",
                   help="this client's NATS user and password (a YAML file, mode 0600; `dynamiccl nats-auth` writes them)")
    p.add_argument("--tls-ca", default=None, metavar="PATH",
                   help="TLS to the NATS servers (tls:// URLs): the CA bundle that signed their certificates")
    p.add_argument("--tls-cert", default=None, metavar="PATH", help="this client's certificate, for servers that verify clients")
    p.add_argument("--tls-key", default=None, metavar="PATH", help="its private key (mode 0600)")
    p.add_argument("--tls-no-handshake-first", action="store_true",
                   help="read the server's INFO before TLS (servers without tls.handshake_first; docs/scale-out.md)")


def register(subparsers) -> None:
    n = subparsers.add_parser("node", help="node collector: the node's ranks (Unix socket) → partials → NATS",
                              description=__doc__.splitlines()[0])
    n.add_argument("--node", required=True, help="this node's name (a NATS subject token)")
    n.add_argument("--job", required=True, help="the job id the node's ranks report")
    n.add_argument("--listen", action="append", default=None, metavar="ADDR",
                   help="plugin socket, unix:PATH (repeatable; default the collector's)")
    n.add_argument("--window", type=float, default=1.0, help="window length, s")
    n.add_argument("--lateness", type=float, default=2.0, help="event-time lateness before a window closes, s")
    n.add_argument("--tokens-file", default=None, metavar="PATH",
                   help="per-job tokens every rank must present (the collector's; its windows then count as "
                        "authenticated at the central tier, which applying tuning requires)")
    n.add_argument("--max-message", type=int, default=1 << 20, metavar="BYTES",
                   help="the bus's max payload (NATS max_payload): a larger partial is sent in parts")
    n.add_argument("--tuner-config", default=None, metavar="PATH",
                   help="write the job's applied tuner config (from `dynamiccl central --apply`, over the bus) "
                        "here, where this node's ranks' tuner plugin reads it (DYNAMICCL_TUNER_CONFIG)")
    n.add_argument("--partitions", type=int, default=1, metavar="P",
                   help="split the job's partials by communicator into P partitions (the central tier's "
                        "--partitions JOB=P; 1: the whole job, one subject)")
    n.add_argument("--wait-streams", action=argparse.BooleanOptionalAction, default=None,
                   help="send the node's untimed collective records (NCCL 2.31+ after a send/recv) so the central "
                        "tier forms the wait streams (AllReduce:wait) as one collector does (scaleout/waits.py)")
    n.add_argument("--tuner-poll", type=float, default=5.0, metavar="S",
                   help="read the job's latest tuner config from the stream this often (besides the live updates)")
    _nats_args(n)
    n.set_defaults(func=main_node)
    c = subparsers.add_parser("central", help="central shard: partials from NATS → merged windows → detector",
                              description=__doc__.splitlines()[0])
    c.add_argument("--shard", required=True, help="this shard's name")
    c.add_argument("--job", action="append", required=True, metavar="JOB=NODE,NODE,...",
                   help="a job and the nodes that report it (repeatable)")
    c.add_argument("--partitions", action="append", default=None, metavar="JOB=P",
                   help="a job whose nodes split it by communicator into P partitions, each merged and detected "
                        "as its own unit, the changes combined per job (repeatable; docs/scale-out.md); with "
                        "--retune/--apply the job's one retuner runs on partition 0's owner, fed every "
                        "partition's windows (every shard needs the same --partitions and retuner flags)")
    c.add_argument("--lateness", type=float, default=2.0, help="s a window waits for its last node")
    c.add_argument("--warmup", type=int, default=60, help="the detector's baseline windows per stream")
    c.add_argument("--changes", default=None, metavar="PATH", help="append each regime change as a JSON line")
    c.add_argument("--ack-wait", type=float, default=3.0, help="s before a dead shard's partials are redelivered")
    _nats_args(c)
    from dynamiccl.scaleout.retuning import add_retuner_args
    add_retuner_args(c)
    c.set_defaults(func=main_central)
    a = subparsers.add_parser("nats-auth", help="NATS users for every node and shard, each allowed only its own subjects",
                              description="Writes DIR/nats-auth.conf (include it in nats-server's configuration) and "
                                          "DIR/<user>.yaml per node and shard (mode 0600; give each to its client only).")
    a.add_argument("--job", action="append", required=True, metavar="JOB=NODE,NODE,...", help="a job and its nodes (repeatable)")
    a.add_argument("--shard", action="append", required=True, help="a central shard's name (repeatable)")
    a.add_argument("--out", required=True, metavar="DIR", help="where the files go (existing users keep their passwords)")
    a.set_defaults(func=main_auth)


def _off(v):
    return None if v is None or v.lower() in _OFF else v


def node_config(args):
    from dynamiccl.collector.config import ReceiverConfig
    from dynamiccl.scaleout.config import NodeServiceConfig
    from dynamiccl.scaleout.node import NodeConfig
    receiver = ReceiverConfig(**({"listen": tuple(args.listen)} if args.listen else {}),
                              tokens_file=getattr(args, "tokens_file", None))
    return NodeServiceConfig(NodeConfig(args.node, args.job, window_s=args.window, allowed_lateness_s=args.lateness,
                                        max_message_bytes=args.max_message,
                                        partitions=getattr(args, "partitions", 1),
                                        **({} if getattr(args, "wait_streams", None) is None
                                           else {"wait_streams": args.wait_streams})),
                             receiver=receiver, nats=_nats(args), metrics=_off(args.metrics),
                             tuner_config=getattr(args, "tuner_config", None),
                             tuner_poll_s=getattr(args, "tuner_poll", 5.0)).validate()


def central_config(args):
    from dynamiccl.scaleout.config import CentralServiceConfig, parse_jobs, parse_partitions
    from dynamiccl.scaleout.merger import MergerConfig
    return CentralServiceConfig(args.shard, MergerConfig(parse_jobs(args.job), lateness_s=args.lateness),
                                nats=_nats(args), metrics=_off(args.metrics), changes_path=args.changes,
                                warmup=args.warmup, partitions=parse_partitions(getattr(args, "partitions", None))
                                ).validate()


def _nats(args):
    from dynamiccl.scaleout.config import NatsConfig
    servers = tuple(args.nats) if args.nats else NatsConfig().servers
    return NatsConfig(servers=servers, replicas=args.replicas, ack_wait_s=getattr(args, "ack_wait", 3.0),
                      credentials=getattr(args, "credentials", None), tls=_tls(args))


def _tls(args):
    """The TLS options, None where none is given (tls:// URLs alone then use the system's CAs)."""
    from dynamiccl.scaleout.tls import TlsConfig
    ca, cert, key = (getattr(args, f"tls_{k}", None) for k in ("ca", "cert", "key"))
    no_first = getattr(args, "tls_no_handshake_first", False)
    if ca is None and cert is None and key is None and not no_first:
        return None
    return TlsConfig(ca=ca, cert=cert, key=key, handshake_first=not no_first)


def _serve_metrics(addr: str | None, registry) -> None:
    if addr is None:
        return
    from prometheus_client import start_http_server
    host, _, port = addr.rpartition(":")
    start_http_server(int(port), addr=host, registry=registry)


def _run(coro_of_stop) -> int:
    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, stop.set)
        await coro_of_stop(stop)
    asyncio.run(main())
    return 0


def _refuse(exc: Exception) -> int:
    print(f"dynamiccl: error: {exc}", file=sys.stderr)
    return 2


def main_node(args) -> int:
    try:
        cfg = node_config(args)
    except ValueError as e:
        return _refuse(e)
    from dynamiccl.scaleout.node import registry
    from dynamiccl.scaleout.service import run_node

    def ready(node, addresses):
        _serve_metrics(cfg.metrics, registry(node))
        log.info("node %s (job %s) listening on %s, publishing to %s", cfg.node.node, cfg.node.job_id,
                 ", ".join(addresses), ", ".join(cfg.nats.servers))
    try:
        return _run(lambda stop: run_node(cfg, stop, ready=ready))
    except OSError as e:
        return _refuse(e)


def central_registry(shard, retuners=None):
    """The shard's counters (received, merged, missing, late, changes) and its jobs' retuners' for /metrics."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily

    class _Shard:
        def collect(self):
            fam = CounterMetricFamily("dynamiccl_central_events", "shard and merger counters", labels=["what"])
            for k, v in {**shard.counters, **shard.merger.counters}.items():
                fam.add_metric([k], v)
            yield fam

    reg = CollectorRegistry()
    reg.register(_Shard())
    if retuners is not None:
        from dynamiccl.scaleout.retuning import retuner_collector
        reg.register(retuner_collector(retuners))
    return reg


async def run_central(cfg, stop: asyncio.Event, *, on_shard=None, retuning=None) -> None:
    """Serve one shard until ``stop``; ``retuning`` (scaleout/retuning.py): a retuner per job."""
    from dynamiccl.scaleout.liveness import BucketClock, Liveness, live_bucket, watch
    from dynamiccl.scaleout.service import ShardRunner, connect

    out = open(cfg.changes_path, "a") if cfg.changes_path else None
    sinks = _change_sinks(out)
    bucket_clock = BucketClock(time.monotonic)      # heartbeats are judged by it: stops while the bucket fails us
    retuners: dict = {}
    make_retuner = mirror = None
    applying = retuning is not None and not retuning.base.dry_run
    if retuning is not None:
        from dynamiccl.scaleout.retuning import retuner_factory
        # the mirror (below, once the shard's counters exist) seeds a job's retuner from the bus's file
        make_retuner = retuner_factory(retuning, retuners,
                                       seed=(lambda job, path: mirror.seed(job, path)) if applying else None)
    shard, table, checkpoints = _central_shard(cfg, bucket_clock, make_retuner, sinks)
    if applying:
        from dynamiccl.scaleout.tuner_publish import TunerMirror
        mirror = TunerMirror(cfg.merger.expected_nodes, shard.counters)
    live = Liveness(table, checkpoints, cfg.node_ttl_s, bucket_clock)
    _serve_metrics(cfg.metrics, central_registry(shard, retuners if retuning is not None else None))
    if on_shard is not None:
        on_shard(shard)
    nc, js = await connect(cfg.nats.servers, replicas=cfg.nats.replicas, credentials=cfg.nats.credentials,
                           counters=shard.counters, timeout_s=cfg.nats.connect_timeout_s, who=f"shard {cfg.shard}",
                           tls=cfg.nats.effective_tls)
    kv = await live_bucket(js, replicas=cfg.nats.replicas)
    watcher = asyncio.create_task(watch(kv, live, stop.is_set, on_update=bucket_clock.echo))
    log.info("shard %s: jobs %s from %s", cfg.shard, sorted(cfg.merger.expected_nodes), ", ".join(cfg.nats.servers))
    hub = await _change_hub(cfg, shard, nc, lambda job, c: sinks(job)[0](c), make_retuner, live.combiners.get)
    after_round = None
    if mirror is not None:                     # applied versions go to the jobs' nodes (scaleout/tuner_publish.py)
        after_round = await _tuner_publishing(mirror, nc, js, shard, make_retuner, retuners)
    if hub is not None:
        after_round = _with_hub(hub, nc, after_round, kv)
    try:
        await ShardRunner(shard, js, ack_wait_s=cfg.nats.ack_wait_s, kv=kv, live=live,
                          bucket_clock=bucket_clock).run(lambda: not stop.is_set(), after_round=after_round,
                                                         on_steps=hub.steps if hub is not None else None)
    finally:
        await _close_central(hub, watcher, after_round, nc, retuners, out)


def _change_sinks(out):
    """``sinks(job)``: where a job's regime changes go — logged, and one JSON line each in ``out``
    (flushed: read while the shard runs). None for a partition's job ([]): its changes go to the job's
    combiner (`_change_hub`), which reports the job's change once."""
    from dynamiccl.scaleout.bus import partition_of

    def sinks(job):
        if partition_of(job) is not None:
            return []

        def record(c):
            log.info("job %s: regime change %s at %.0f (onset %.0f) ranks %s", job, c.kind, c.detected_s, c.start_s,
                     list(c.ranks)[:4])
            if out is not None:
                out.write(json.dumps({"job": job, **json.loads(c.to_json())}) + "\n")
                out.flush()
        return [record]
    return sinks


def _central_shard(cfg, bucket_clock, make_retuner, sinks):
    """(shard, its table, its checkpoints): the merger expects each job's nodes (× its partitions);
    merged windows go through a detector loop (warm-up ``cfg.warmup``, no autoencoder)."""
    from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
    from dynamiccl.scaleout.central import CentralShard, detector_loop
    from dynamiccl.scaleout.merger import ShardTable, units

    table, checkpoints = ShardTable(cfg.heartbeat_ttl_s, bucket_clock), {}
    merger = replace(cfg.merger, expected_nodes=units(cfg.merger.expected_nodes, cfg.partitions))
    shard = CentralShard(cfg.shard, merger, table, checkpoints,
                         detector_loop(DetectorConfig(baseline=BaselineConfig(warmup=cfg.warmup),
                                                      autoencoder=AutoencoderConfig(enabled=False)).validate(),
                                       make_retuner=make_retuner, sinks=sinks),
                         time.monotonic, bus_authenticated=cfg.nats.credentials is not None)
    return shard, table, checkpoints


async def _tuner_publishing(mirror, nc, js, shard, make_retuner, retuners):
    """Start the tuner mirror; → ``after_round``, which publishes the retuners' applied versions
    that are due to the jobs' nodes (a conflict rebuilds the job's retuner)."""
    from dynamiccl.scaleout.tuner_publish import TunerPublisher
    await mirror.start(nc, js)
    publisher = TunerPublisher(js, shard.counters, mirror, on_conflict=make_retuner.rebuild)

    def after_round():
        return publisher.publish_due({j: jr.retuner.pusher for j, jr in retuners.items()})
    return after_round


async def _close_central(hub, watcher, after_round, nc, retuners, out) -> None:
    """The shard's shutdown, in order: the hub, the bucket watcher, a last ``after_round`` (a
    version applied in the last round still reaches the nodes), the bus, the retuners, the file."""
    if hub is not None:
        hub.close()
    await watcher
    if after_round is not None:
        await after_round()
    await nc.close()
    for jr in retuners.values():
        jr.close()
    if out is not None:
        out.close()

async def _change_hub(cfg, shard, nc, deliver, make_retuner=None, stored=None):
    """The partitioned jobs' change notes (scaleout/change_bus.py), with their windows for the job's
    retuner where ``make_retuner`` builds one; None when no job is partitioned."""
    if not any(k > 1 for k in cfg.partitions.values()):
        return None
    import time as _time

    from dynamiccl.scaleout.change_bus import ChangeHub
    hub = ChangeHub(cfg.partitions, lambda u: shard.table.owns(shard.name, u), _time.monotonic, deliver,
                    retuner=make_retuner, bus_authenticated=shard.bus_authenticated, stored=stored)
    async def receive(m):
        hub.receive(m.data, m.subject)
    for subj in hub.subjects:
        await nc.subscribe(subj, cb=receive)
    shard.counters.update(hub.counters)    # one dict: the hub's counters on the shard's /metrics
    hub.counters = shard.counters
    return hub


def _with_hub(hub, nc, after_round, kv=None):
    """After each round: send this shard's notes, run the combiners it holds, save their state in the
    liveness bucket (for the next owner of their partition 0), then ``after_round``."""
    from dynamiccl.scaleout.liveness import comb_key

    async def run():
        for subj, data in hub.outgoing():
            try:
                await nc.publish(subj, data)
            except Exception as e:  # noqa: BLE001 - the bus is down: the note is lost, counted
                hub.counters["notes_dropped"] += 1
                log.debug("change note: %r", e)
        hub.round()
        for job, data in hub.snapshots() if kv is not None else ():
            try:
                await asyncio.wait_for(kv.put(comb_key(job), data), 1.0)
            except Exception as e:  # noqa: BLE001 - no leader for a moment: saved next round, counted
                hub.counters["combiner_save_errors"] = hub.counters.get("combiner_save_errors", 0) + 1
                hub.unsaved(job)
                log.debug("combiner state of %s: %r", job, e)
        if after_round is not None:
            await after_round()
    return run


def main_central(args) -> int:
    from dynamiccl.scaleout.retuning import retuning_from_args
    try:
        cfg = central_config(args)
        retuning = retuning_from_args(args, cfg.merger.expected_nodes)
    except ValueError as e:
        return _refuse(e)
    if retuning is not None:
        log.info("shard %s: a retuner per job, %s", cfg.shard,
                 "dry run (recommend only)" if retuning.base.dry_run else f"applying to jobs {retuning.base.jobs}")
    try:
        return _run(lambda stop: run_central(cfg, stop, retuning=retuning))
    except OSError as e:
        return _refuse(e)


def main_auth(args) -> int:
    from pathlib import Path

    from dynamiccl.scaleout.auth import AUTH_CONF, write_auth
    from dynamiccl.scaleout.config import parse_jobs
    try:
        files = write_auth(Path(args.out), parse_jobs(args.job), list(dict.fromkeys(args.shard)))
    except (ValueError, OSError) as e:
        return _refuse(e)
    print(f"{Path(args.out) / AUTH_CONF}: {len(files)} users (include it in nats-server's configuration)")
    for user, path in files.items():
        print(f"{user}: {path}")
    return 0
