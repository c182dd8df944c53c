"""`dynamiccl demo`: a simulated training job through the real plugins and the whole pipeline, live.

It starts the collector in process (plugin socket, ``/metrics``, parquet history), the detector
(`detector.service.Detector`) on the collector's feature stream, and the retuner
(`retuner.Retuner`), which writes the tuner config file that the REAL tuner plugin reads. The
simulated job (``simulator``) asks that plugin for every collective's algorithm/protocol/channels
through its ABI, and its node processes report every collective through the REAL profiler plugin.
A live terminal view shows bandwidth, the true regime, detected changes and config changes; the
summary says what happened, what was detected when, what was retuned and what it gained.

Files in ``--out``: ``parquet/`` (history), ``sim/truth.jsonl`` (ground truth), ``changes.jsonl``
(detected regime changes), ``retuner-audit.jsonl`` (every retuner decision), ``tuner.conf``.
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
    p.add_argument("--warmup", type=int, default=20,
                   help="detector baseline windows (default 20 for the demo; the service default is 60)")
    p.add_argument("--no-autoencoder", action="store_true", help="CUSUM streams only (no torch autoencoder)")
    p.add_argument("--dry-run", action="store_true",
                   help="retuner recommends only (the service default); the demo applies by default")
    p.set_defaults(func=run)


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


def _match(truth: list[dict], changes: list, epoch_s: float, window_s: float = 5.0) -> list[dict]:
    """Pair each truth event with the first detected change within `window_s` after its onset
    (a ``recovery`` truth event with a ``recovery`` change; others with any non-recovery change)."""
    rows, used = [], set()
    for ev in truth:
        want_recovery = ev["kind"] == "recovery"
        hit = next((c for c in changes if id(c) not in used and (c.kind == "recovery") == want_recovery
                    and ev["t_start"] - 1.0 <= c.detected_s - epoch_s <= ev["t_start"] + window_s), None)
        if hit is not None:
            used.add(id(hit))
        rows.append({**ev, "change": hit})
    return rows


def _plugin_tuner(conf: Path):
    """The real tuner plugin (a private instance, immediate mode), re-reading ``conf`` at every step boundary.
    In the simulator the engine makes one decision per collective for all ranks, so there is nothing to
    agree on; real jobs use the agreement hook (nccl_tuner_plugin/README.md)."""
    from simulator.tuner_abi import PluginTuner, TunerPlugin

    plugin = TunerPlugin.private_copy()
    plugin.configure(str(conf), mode="immediate", poll_ms=0)
    return PluginTuner(plugin, step_hook=lambda t, step: t.plugin.reload())


def run(args: argparse.Namespace) -> int:
    from collector.config import default_config
    from collector.pipeline import Pipeline
    from detector.config import DetectorConfig
    from detector.service import Detector
    from retuner.agent import Retuner
    from retuner.config import PolicyConfig, RetunerConfig
    from simulator.driver import SimulatedJob
    from simulator.workload import load as load_workload

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("changes.jsonl", "retuner-audit.jsonl", "tuner.conf"):
        (out / name).unlink(missing_ok=True)
    sock_dir = tempfile.mkdtemp(prefix="dynamiccl-demo-")
    listen = f"unix:{sock_dir}/collector.sock"
    metrics = _free_metrics_address(args.metrics)
    cfg = default_config().replace(receiver={"listen": (listen,)},
                                   parquet={"directory": str(out / "parquet"), "flush_interval_s": 10.0},
                                   prometheus={"address": metrics}, features={"address": None})
    pipeline = Pipeline(cfg).start()
    # Room for every window of the run: in --fast mode the simulation outruns the detector, and a
    # dropped window would be a hole in the detector's view (drops are counted, never silent).
    sub = pipeline.subscribe(max_queue=4096)
    # A 90 s demo cannot afford the production warm-up (60 windows): 20 windows of baseline.
    detector = Detector(DetectorConfig(warmup=args.warmup, autoencoder=not args.no_autoencoder))
    topo = load_workload(args.workload).topology.name
    # The demo tunes on detected changes only (no start-up exploration, which would itself move the
    # latencies the detector is learning), and gives a push time to reach the job: records of the
    # window being processed lag the simulated job by the window close (window + lateness, ~3 s in
    # real time; more in --fast, where the simulation runs ahead of the pipeline).
    grace = 4.0 if not args.fast else 12.0
    policy = PolicyConfig(tune_at_start=False, apply_grace_s=grace, republish_after_s=grace)
    retuner = Retuner(RetunerConfig(dry_run=args.dry_run, tuner_config_path=str(out / "tuner.conf"),
                                    audit_path=str(out / "retuner-audit.jsonl"), topology=topo, seed=args.seed,
                                    policy=policy))
    tuner = _plugin_tuner(out / "tuner.conf")
    job = SimulatedJob(args.workload, args.scenario, collector=listen, realtime=not args.fast,
                       seed=args.seed, duration_s=args.duration, out_dir=out / "sim", tuner=tuner)
    state = _State()
    changes_fh = open(out / "changes.jsonl", "w")

    def handle(wf) -> None:
        state.windows += 1
        for c in detector.process(wf):
            state.changes.append(c)
            changes_fh.write(c.to_json() + "\n")
            changes_fh.flush()
            log.info("regime change: %s at t=%.0f s (onset %.0f s) magnitude %.2f where %s",
                     c.kind, c.detected_s - state.epoch_s, c.start_s - state.epoch_s, c.magnitude,
                     ",".join(c.comm_names or c.comms)[:60] + (f" ranks {c.ranks[:3]}" if c.ranks else ""))
            v = retuner.on_change(c)
            if v is not None:
                state.versions.append((wf.window_start - state.epoch_s, v))
        v = retuner.on_window(wf)
        if v is not None:
            state.versions.append((wf.window_start - state.epoch_s, v))

    try:
        job.start()
        state.epoch_s = job.engine.epoch_ns / 1e9
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
                    handle(wf)
                if view:
                    view.update(latest, state, retuner)
                elif time.monotonic() - last_print > 10:
                    last_print = time.monotonic()
                    log.info("windows=%d records=%d changes=%d", state.windows, pipeline.metrics.received,
                             len(state.changes))
                if finished and wf is None:
                    break
        result = job.wait()
    except KeyboardInterrupt:
        job.stop()
        result = job.wait()
    finally:
        pipeline.shutdown()
        while (wf := sub.get(timeout=0.5)) is not None:     # windows closed during shutdown
            handle(wf)
        changes_fh.close()
        retuner.close()
        tuner.close()
    _summary(args, truth, state, pipeline, result, metrics, out)
    return 0


@dataclass
class _State:
    epoch_s: float = 0.0
    windows: int = 0
    changes: list = field(default_factory=list)
    versions: list = field(default_factory=list)     # (t, tuner config version written)


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

    def update(self, wf, state, retuner):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table

        epoch_s = state.epoch_s
        now = (wf.window_start - epoch_s) if wf is not None else 0.0
        regime = [e for e in self.truth if e["t_start"] <= now < e["t_end"] and not e.get("benign")]
        version = state.versions[-1][1] if state.versions else 0
        header = (f"[b]DynamICCL demo[/b]  t={now:5.0f} s  scenario={self.args.scenario}  "
                  f"workload={self.args.workload}  /metrics: http://{self.metrics}/metrics\n"
                  f"true regime: [yellow]{', '.join(e['kind'] for e in regime) or 'baseline'}[/yellow]   "
                  f"records received={self.pipeline.metrics.received:,}  "
                  f"dropped={sum(self.pipeline.metrics.dropped.values()):,}   "
                  f"tuner config version={version}{' (dry run)' if self.args.dry_run else ''}")
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
        changes = Table(title="detected regime changes", expand=True)
        for col in ("detected (s)", "onset (s)", "kind", "magnitude", "where"):
            changes.add_column(col)
        for c in state.changes[-6:]:
            changes.add_row(f"{c.detected_s - epoch_s:.0f}", f"{c.start_s - epoch_s:.0f}", c.kind,
                            f"{c.magnitude:.2f}x", _where(c))
        tuned = Table(title="retuner targets", expand=True)
        for col in ("target", "running", "baseline", "regime", "exploring"):
            tuned.add_column(col)
        for st in retuner.status()[:6]:
            tuned.add_row(st["target"], str(st["running"]), str(st["baseline"]), str(st["regime"]),
                          str(st["exploring"] or ""))
        self._live.update(Group(Panel(header), table, changes, tuned))


def _where(c) -> str:
    parts = []
    if c.ranks:
        parts.append("ranks " + ",".join(map(str, c.ranks[:4])))
    if c.comm_names or c.comms:
        parts.append(",".join(c.comm_names or c.comms)[:40])
    if c.size_buckets:
        parts.append(f"{len(c.size_buckets)} size buckets")
    return "; ".join(parts) or "-"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"


def _summary(args, truth, state, pipeline, result, metrics, out: Path) -> None:
    import json
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows = _match(truth, state.changes, state.epoch_s)
    table = Table(title="What happened, and what was detected")
    for col in ("event", "true onset (s)", "ends (s)", "detected at (s)", "delay (s)", "kind", "where"):
        table.add_column(col)
    for row in rows:
        c = row["change"]
        kind = row["kind"] + (" (benign)" if row.get("benign") else "")
        table.add_row(kind, f"{row['t_start']:.0f}", f"{row['t_end']:.0f}",
                      f"{c.detected_s - state.epoch_s:.0f}" if c else "-",
                      f"{c.detected_s - state.epoch_s - row['t_start']:.0f}" if c else "-",
                      c.kind if c else "-", _where(c) if c else "-")
    console.print(table)
    matched = {id(r["change"]) for r in rows if r["change"] is not None}
    matched_ids = {r["change"].id for r in rows if r["change"] is not None}
    # a recovery of a matched change (e.g. a straggler's end) is right too, not an extra change
    extra = [c for c in state.changes if id(c) not in matched and not (c.kind == "recovery" and c.recovers in matched_ids)]
    dropped = dict(pipeline.metrics.dropped)
    console.print(
        f"simulated {result.sim_seconds:.0f} s in {result.wall_seconds:.0f} s wall; "
        f"records sent by the plugin: {result.totals().get('records_sent', 0):,}; "
        f"aggregated by the collector: {pipeline.metrics.aggregated:,} "
        f"(received {pipeline.metrics.received:,} incl. the plugins' stats records); "
        f"dropped: {sum(dropped.values()):,} {dict((k, v) for k, v in dropped.items() if v)}; "
        f"windows: {state.windows}; detected changes not matching a true change: {len(extra)}")
    audit = []
    try:
        audit = [json.loads(line) for line in (out / "retuner-audit.jsonl").read_text().splitlines() if line]
    except (OSError, ValueError):
        pass
    actions = Counter(a.get("action") for a in audit)
    gains = [a for a in audit if a.get("action") == "keep" and a.get("gain") is not None]
    rt = Table(title="What the retuner did" + (" (dry run: recommendations only)" if args.dry_run else ""))
    for col in ("t (s)", "action", "target", "config", "measured gain"):
        rt.add_column(col)
    for a in [a for a in audit if a.get("action") in ("keep", "rollback", "revert", "reuse", "recommend",
                                                       "unapplicable")][-12:]:
        t = a.get("t")
        rt.add_row(f"{t - state.epoch_s:.0f}" if isinstance(t, (int, float)) else "-", a["action"],
                   str(a.get("target", "-")), str(a.get("candidate") or a.get("config") or a.get("active") or "-"),
                   f"{a['gain'] * 100:+.1f} %" if isinstance(a.get("gain"), (int, float)) else "-")
    console.print(rt)
    console.print(f"retuner: {dict(actions)}; tuner config versions written: {len(state.versions)}"
                  + (f" (last {state.versions[-1][1]})" if state.versions else "")
                  + f"; kept with a measured gain: {len(gains)}")
    console.print(f"files: {out / 'parquet'}  {out / 'sim' / 'truth.jsonl'}  {out / 'changes.jsonl'}  "
                  f"{out / 'retuner-audit.jsonl'}  {out / 'tuner.conf'}")
