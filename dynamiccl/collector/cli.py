"""``dynamiccl collector``: run the collector until SIGINT/SIGTERM.

Startup errors (bad address, port in use, unwritable parquet directory) print one clear line and
exit non-zero; after startup nothing is fatal. Every flag defaults to docs/architecture.md.
"""
from __future__ import annotations

import argparse
import os

__all__ = ["register", "run", "config_from_args"]

_OFF = ("off", "none", "")
SHUTDOWN_TIMEOUT_S = 4.0  # SIGTERM ends the collector within this (plus a signal-wait tick)
# the pipeline aims to finish this much earlier, leaving time for the signal wait tick and the exit
# itself on a starved machine (the process must be gone within 5 s of SIGTERM)
EXIT_RESERVE_S = 1.0


def register(subparsers) -> argparse.ArgumentParser:
    from dynamiccl.collector.config import (DEFAULT_FEATURES, DEFAULT_LISTEN, DEFAULT_METRICS,
                                  DEFAULT_PARQUET_DIR)
    p = subparsers.add_parser(
        "collector", help="receive plugin records; serve /metrics, parquet history, feature stream",
        description=__doc__.splitlines()[0])
    p.add_argument("--listen", action="append", metavar="ADDR",
                   help=f"unix:PATH or tcp:HOST:PORT, repeatable (default {DEFAULT_LISTEN}); 'off' for none")
    p.add_argument("--metrics", metavar="HOST:PORT", default=DEFAULT_METRICS,
                   help=f"Prometheus /metrics address (default {DEFAULT_METRICS}); 'off' to disable")
    p.add_argument("--parquet", metavar="DIR", default=DEFAULT_PARQUET_DIR,
                   help=f"parquet history directory (default {DEFAULT_PARQUET_DIR}); 'off' to disable")
    p.add_argument("--features", metavar="ADDR", default=DEFAULT_FEATURES,
                   help=f"feature stream server unix:PATH or tcp:HOST:PORT (default {DEFAULT_FEATURES}); 'off'")
    p.add_argument("--window", metavar="S", type=float, default=None,
                   help="window length in seconds of event time (default 1)")
    p.add_argument("--lateness", metavar="S", type=float, default=None,
                   help="allowed lateness in seconds (default 2)")
    p.add_argument("--max-skew", metavar="S", type=float, default=None,
                   help="how far (event-time seconds) a lagging host may hold windows open (default 10)")
    p.add_argument("--replay", action="append", metavar="PATH", default=None,
                   help="parquet file or directory to replay into the pipeline at start (repeatable)")
    p.add_argument("--gpu-telemetry", choices=("on", "off"), default="on",
                   help="GPU metrics via NVML (default on; without a driver it says so once and carries on)")
    p.add_argument("--tokens-file", metavar="PATH", default=os.environ.get("DYNAMICCL_COLLECTOR_TOKENS_FILE"),
                   help="per-job tokens (TOKEN or JOB_ID TOKEN a line, mode 600): every peer must present one "
                        "(default $DYNAMICCL_COLLECTOR_TOKENS_FILE; none: no peer is authenticated)")
    p.add_argument("--no-auth-unix", action="store_true",
                   help="with --tokens-file, let Unix-socket peers in without a token (the socket's directory "
                        "permissions are then the only protection)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow listening on non-loopback addresses (the record port is then reachable from "
                        "other hosts; use --tokens-file, see docs/security.md)")
    p.set_defaults(func=run, hard_exit=True)   # dynamiccl.cli.entry: no interpreter teardown
    return p


def config_from_args(args: argparse.Namespace):
    from dynamiccl.collector.config import DEFAULT_LISTEN, default_config
    listen = args.listen if args.listen is not None else [DEFAULT_LISTEN]
    listen = tuple(a for a in listen if a.lower() not in _OFF)
    off = lambda v: None if v is None or v.lower() in _OFF else v  # noqa: E731
    window = {}
    if args.window is not None:
        window["window_s"] = args.window
    if args.lateness is not None:
        window["allowed_lateness_s"] = args.lateness
    if args.max_skew is not None:
        window["max_skew_s"] = args.max_skew
    receiver = {"listen": listen, "tokens_file": getattr(args, "tokens_file", None),
                "auth_unix": not getattr(args, "no_auth_unix", False)}
    cfg = default_config().replace(receiver=receiver, window=window,
                                   prometheus={"address": off(args.metrics)},
                                   features={"address": off(args.features)},
                                   parquet={"directory": off(args.parquet)},
                                   replay=tuple(args.replay or ()),
                                   telemetry={"gpu": getattr(args, "gpu_telemetry", "on") == "on"})
    cfg.validate()
    if not getattr(args, "allow_remote", False):
        for key, address in _network_addresses(cfg):
            if not is_loopback(address):
                raise ValueError(f"{key} {address} is not a loopback address: pass --allow-remote to listen "
                                 "beyond this host (and --tokens-file; see docs/security.md)")
    return cfg


def _network_addresses(cfg):
    from dynamiccl.collector.config import parse_address, parse_host_port
    for a in cfg.receiver.listen:
        kind, target = parse_address(a, key="listen")
        if kind == "tcp":
            yield "--listen", target[0]
    if cfg.prometheus.address:
        yield "--metrics", parse_host_port(cfg.prometheus.address, key="metrics")[0]
    if cfg.features.address and cfg.features.address.startswith("tcp:"):
        yield "--features", parse_address(cfg.features.address, key="features")[1][0]


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and localhost; a name is resolved (a wildcard address is not loopback)."""
    import ipaddress
    import socket
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(i[4][0]).is_loopback for i in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def run(args: argparse.Namespace) -> int:
    from dynamiccl.collector.pipeline import Pipeline
    from dynamiccl.contracts.lifecycle import ServiceRun, run_service
    cfg = config_from_args(args)  # ValueError → "dynamiccl collector: error: ..." exit 2

    def ready(pipeline) -> str:
        a = pipeline.addresses
        return (f"collector ready: listen={','.join(a['listen']) or '-'} metrics={a['metrics'] or '-'} "
                f"features={a['features'] or '-'} parquet={cfg.parquet.directory or '-'}")

    def stopped(pipeline) -> str:
        m = pipeline.metrics.snapshot()
        return (f"collector stopped: received={m['records_received_total']} "
                f"decoded={m['records_decoded_total']} windows={m['windows_emitted_total']}")

    # a wedged writer or exporter must not hold the exit: past the deadline the parquet writer sees the end
    # of its channel and finishes its files itself
    return run_service(ServiceRun(
        "collector", lambda: Pipeline(cfg).start(), ready=ready, stopped=stopped,
        stop=lambda pipeline: pipeline.shutdown(timeout=SHUTDOWN_TIMEOUT_S - EXIT_RESERVE_S),
        start_errors=(((OSError, ValueError), 1),),  # unusable address, directory or tokens file
        shutdown_timeout_s=SHUTDOWN_TIMEOUT_S))
