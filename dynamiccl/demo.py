"""`dynamiccl demo`: a simulated training job through the real plugin into the collector, live.

It starts the collector in process (plugin socket, ``/metrics``, parquet history), starts a
simulated job (``simulator``) whose node processes load the real profiler plugin, watches the
feature stream with one CUSUM per (communicator, collective, size bucket) stream, and shows a
live terminal view. At the end it prints what happened (the scenario's ground truth), what was
flagged and when, and what the collector counted.

The per-stream CUSUM watch here is the demo's own interim trigger; the detector service with
fusion, classification and localisation is `detector/` (its own issue).
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("dynamiccl.demo")

DEFAULT_METRICS = "127.0.0.1:9464"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a simulated job through the real plugins, live")
    p.add_argument("--scenario", default="demo", help="scenario preset or YAML path (default: demo, ~90 s)")
    p.add_argument("--workload", default="llama7b-tp8-dp2", help="workload preset or YAML path")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds (default: the scenario's)")
    p.add_argument("--fast", action="store_true", help="run as fast as possible instead of in real time")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/demo", help="output directory (parquet history, truth, summary)")
    p.add_argument("--metrics", default=DEFAULT_METRICS,
                   help="HOST:PORT for /metrics (a free port is used if this one is taken)")
    p.add_argument("--no-live", action="store_true", help="plain log lines instead of the live view")
    p.set_defaults(func=run)


# ------------------------------------------------------------------------------------------------
@dataclass
class Flag:
    """One (merged) alarm: the streams that fired within `merge_s` of the first one."""
    t: float                 # window start, seconds since the job epoch
    direction: str
    streams: list[str] = field(default_factory=list)


class StreamWatch:
    """One CUSUM per feature stream over log(p50 latency); alarms within `merge_s` merge."""

    def __init__(self, *, warmup: int = 20, delta: float = 3.0, arl0: float = 1e4, merge_s: float = 5.0):
        self.warmup, self.delta, self.arl0, self.merge_s = warmup, delta, arl0, merge_s
        self._cusums: dict[tuple, object] = {}
        self.flags: list[Flag] = []
        self.windows = 0

    def update(self, wf, epoch_s: float) -> list[Flag]:
        from detector import CUSUM

        self.windows += 1
        new: list[Flag] = []
        t = wf.window_start - epoch_s
        keys = wf.keys.select("comm_name", "func", "size_bucket", "lat_p50_s").to_dicts()
        for row in keys:
            lat = row["lat_p50_s"]
            if lat is None or not lat > 0:
                continue
            k = (row["comm_name"], row["func"], row["size_bucket"])
            det = self._cusums.get(k)
            if det is None:
                det = self._cusums[k] = CUSUM(delta=self.delta, arl0=self.arl0, warmup=self.warmup,
                                              min_value=None, z_clip=100.0)
            det.update(math.log(lat))
            if det.drift_detected:
                name = f"{row['func']} {row['comm_name']} 2^{row['size_bucket']}B {det.direction}"
                last = self.flags[-1] if self.flags else None
                if last is not None and t - last.t <= self.merge_s and last.direction == det.direction:
                    last.streams.append(name)
                else:
                    flag = Flag(t, det.direction, [name])
                    self.flags.append(flag)
                    new.append(flag)
        return new


# ------------------------------------------------------------------------------------------------
def _free_metrics_address(wanted: str) -> str:
    host, port = wanted.rsplit(":", 1)
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
            return wanted
        except OSError:
            s.bind((host, 0))
            return f"{host}:{s.getsockname()[1]}"


def _match(truth: list[dict], flags: list[Flag], window_s: float = 5.0) -> list[dict]:
    """Pair each non-benign truth event with the first flag within `window_s` after its onset."""
    rows = []
    for ev in truth:
        hit = next((f for f in flags if ev["t_start"] - 1.0 <= f.t <= ev["t_start"] + window_s), None)
        rows.append({**ev, "flag": hit})
    return rows


def run(args: argparse.Namespace) -> int:
    from collector.config import default_config
    from collector.pipeline import Pipeline
    from simulator.driver import SimulatedJob

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sock_dir = tempfile.mkdtemp(prefix="dynamiccl-demo-")
    listen = f"unix:{sock_dir}/collector.sock"
    metrics = _free_metrics_address(args.metrics)
    cfg = default_config().replace(receiver={"listen": (listen,)},
                                   parquet={"directory": str(out / "parquet"), "flush_interval_s": 10.0},
                                   prometheus={"address": metrics}, features={"address": None})
    pipeline = Pipeline(cfg).start()
    sub = pipeline.subscribe()
    watch = StreamWatch()
    job = SimulatedJob(args.workload, args.scenario, collector=listen, realtime=not args.fast,
                       seed=args.seed, duration_s=args.duration, out_dir=out / "sim")
    try:
        job.start()
        epoch_s = job.engine.epoch_ns / 1e9
        truth = job.truth()
        view = _LiveView(args, truth, metrics, pipeline) if not args.no_live else None
        last_print = time.monotonic()
        latest = None
        with (view.live() if view else _nullcontext()):
            while True:
                finished = not job._thread.is_alive()
                wf = sub.get(timeout=0.25)
                if wf is not None:
                    latest = wf
                    for flag in watch.update(wf, epoch_s):
                        log.info("regime change flagged at t=%.0f s (%s)", flag.t, flag.streams[0])
                if view:
                    view.update(latest, watch, epoch_s)
                elif time.monotonic() - last_print > 10:
                    last_print = time.monotonic()
                    log.info("windows=%d records=%d", watch.windows, pipeline.metrics.received)
                if finished and wf is None:
                    break
        result = job.wait()
    except KeyboardInterrupt:
        job.stop()
        result = job.wait()
    finally:
        pipeline.shutdown()
        # windows closed during shutdown
        while (wf := sub.get(timeout=0.5)) is not None:
            watch.update(wf, epoch_s)
    _summary(args, truth, watch, pipeline, result, metrics, out)
    return 0


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------------------
class _LiveView:
    def __init__(self, args, truth, metrics, pipeline):
        from rich.console import Console
        self.console = Console()
        self.args, self.truth, self.metrics, self.pipeline = args, truth, metrics, pipeline
        self._live = None

    def live(self):
        from rich.live import Live
        self._live = Live(console=self.console, refresh_per_second=4, transient=False)
        return self._live

    def update(self, wf, watch, epoch_s):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table

        now = (wf.window_start - epoch_s) if wf is not None else 0.0
        regime = [e for e in self.truth if e["t_start"] <= now < e["t_end"] and not e.get("benign")]
        header = (f"[b]DynamICCL demo[/b]  t={now:5.0f} s  scenario={self.args.scenario}  "
                  f"workload={self.args.workload}  /metrics: http://{self.metrics}/metrics\n"
                  f"true regime: [yellow]{', '.join(e['kind'] for e in regime) or 'baseline'}[/yellow]   "
                  f"records received={self.pipeline.metrics.received:,}  "
                  f"dropped={sum(self.pipeline.metrics.dropped.values()):,}")
        table = Table(title="last window: collectives (all communicators)", expand=True)
        for col in ("collective", "size", "algo/proto", "records", "p50 latency", "bus bw"):
            table.add_column(col, justify="right")
        if wf is not None and wf.keys.height:
            import polars as pl
            agg = (wf.keys.group_by("func", "size_bucket", "algo", "proto")
                   .agg(pl.col("records").sum(), pl.col("lat_p50_s").median(), pl.col("busbw_Bps").median())
                   .sort("records", descending=True).head(10))
            for r in agg.iter_rows(named=True):
                table.add_row(r["func"], _fmt_bytes(2 ** r["size_bucket"]), f"{r['algo']}/{r['proto']}",
                              f"{r['records']:,}", f"{(r['lat_p50_s'] or 0) * 1e3:.3f} ms",
                              f"{(r['busbw_Bps'] or 0) / 1e9:.1f} GB/s")
        flags = Table(title="flagged regime changes", expand=True)
        for col in ("t (s)", "direction", "streams", "first stream"):
            flags.add_column(col)
        for f in watch.flags[-6:]:
            flags.add_row(f"{f.t:.0f}", f.direction, str(len(f.streams)), f.streams[0])
        self._live.update(Group(Panel(header), table, flags))


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"


def _summary(args, truth, watch, pipeline, result, metrics, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="What happened, and what was flagged")
    for col in ("event", "true onset (s)", "ends (s)", "flagged at (s)", "delay (s)"):
        table.add_column(col)
    for row in _match(truth, watch.flags):
        f = row["flag"]
        kind = row["kind"] + (" (benign)" if row.get("benign") else "")
        table.add_row(kind, f"{row['t_start']:.0f}", f"{row['t_end']:.0f}",
                      f"{f.t:.0f}" if f else "-", f"{f.t - row['t_start']:.0f}" if f else "-")
    console.print(table)
    matched = {id(r["flag"]) for r in _match(truth, watch.flags) if r["flag"]}
    extra = [f for f in watch.flags if id(f) not in matched]
    dropped = dict(pipeline.metrics.dropped)
    console.print(
        f"simulated {result.sim_seconds:.0f} s in {result.wall_seconds:.0f} s wall; "
        f"records sent by the plugin: {result.totals().get('records_sent', 0):,}; "
        f"received by the collector: {pipeline.metrics.received:,}; "
        f"dropped: {sum(dropped.values()):,} {dict((k, v) for k, v in dropped.items() if v)}; "
        f"windows: {watch.windows}; flags not matching a true change: {len(extra)}")
    console.print(f"parquet history: {out / 'parquet'}   ground truth: {out / 'sim' / 'truth.jsonl'}")
    console.print("retuning: not yet available (the retuner is a later issue); nothing was changed.")
