"""``dynamiccl collector``: run the collector until SIGINT/SIGTERM.

Startup errors (bad address, port in use, unwritable parquet directory) print one clear line and
exit non-zero; after startup nothing is fatal. Every flag defaults to docs/architecture.md.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

__all__ = ["register", "run", "config_from_args"]

log = logging.getLogger("collector")
_OFF = ("off", "none", "")
SHUTDOWN_TIMEOUT_S = 4.0  # SIGTERM ends the collector within this (plus a signal-wait tick)


def register(subparsers) -> argparse.ArgumentParser:
    from collector.config import (DEFAULT_FEATURES, DEFAULT_LISTEN, DEFAULT_METRICS,
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
    p.set_defaults(func=run)
    return p


def config_from_args(args: argparse.Namespace):
    from collector.config import DEFAULT_LISTEN, default_config
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
    cfg = default_config().replace(receiver={"listen": listen}, window=window,
                                   prometheus={"address": off(args.metrics)},
                                   features={"address": off(args.features)},
                                   parquet={"directory": off(args.parquet)},
                                   replay=tuple(args.replay or ()),
                                   telemetry={"gpu": getattr(args, "gpu_telemetry", "on") == "on"})
    return cfg.validate()


def _bounded_shutdown(pipeline, timeout: float) -> bool:
    """Flush and stop the pipeline; False if that takes longer than ``timeout`` seconds."""
    done = threading.Event()

    def _stop():
        try:
            pipeline.shutdown(timeout=timeout)
        finally:
            done.set()

    threading.Thread(target=_stop, name="dynamiccl-shutdown", daemon=True).start()
    return done.wait(timeout)


def run(args: argparse.Namespace) -> int:
    from collector.pipeline import Pipeline
    cfg = config_from_args(args)  # ValueError → "dynamiccl collector: error: ..." exit 2
    stop = threading.Event()

    def _signal(signum, _frame):
        if stop.is_set():  # a second signal: the user wants out now
            os._exit(3)
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, _signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            pipeline = Pipeline(cfg).start()
        except OSError as exc:
            print(f"dynamiccl collector: error: {exc.strerror or exc}", file=sys.stderr)
            return 1
        a = pipeline.addresses
        print(f"collector ready: listen={','.join(a['listen']) or '-'} metrics={a['metrics'] or '-'} "
              f"features={a['features'] or '-'} parquet={cfg.parquet.directory or '-'}", flush=True)
        while not stop.wait(0.5):
            pass
        if not _bounded_shutdown(pipeline, SHUTDOWN_TIMEOUT_S):
            print(f"dynamiccl collector: error: shutdown did not finish within {SHUTDOWN_TIMEOUT_S:g} s "
                  "(a wedged writer or exporter); exiting without it", file=sys.stderr, flush=True)
            os._exit(3)  # the parquet writer sees the end of file and finishes its files itself
        m = pipeline.metrics.snapshot()
        print(f"collector stopped: received={m['records_received_total']} "
              f"decoded={m['records_decoded_total']} windows={m['windows_emitted_total']}", flush=True)
        return 0
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
