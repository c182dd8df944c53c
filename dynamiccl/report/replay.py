"""``dynamiccl replay``: re-run detection over a recorded run with other settings ("what if").

The run's usable part files (see :mod:`dynamiccl.report.inventory`) are read back (the collector's
``read_batches``), merged in event-time order across files and hosts (:class:`EventTimeMerge`)
and go through the collector's ``WindowAggregator`` (window / lateness settings of your
choice) into the detector (:class:`dynamiccl.detector.service.Detector`), synchronously, losing nothing:
there is no queue to overflow. Regime changes are printed, optionally written as JSONL (the
report's ``changes.jsonl``), and scored against the ground truth when a ``truth.jsonl`` is found.
"""
from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.detector.config import DetectorConfig, parse_overrides
from dynamiccl.detector.events import RegimeChange
from dynamiccl.loop import Loop

__all__ = ["ReplayResult", "EventTimeMerge", "replay", "replay_main", "add_detector_args", "detector_config_from_args"]

log = logging.getLogger(__name__)


@dataclass
class ReplayResult:
    changes: list[RegimeChange] = field(default_factory=list)
    windows: int = 0
    records: int = 0
    invalid: int = 0
    late: int = 0
    files: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    detector: str = ""
    decisions: list[dict] = field(default_factory=list)  # retuner audit records (dry run)
    retuner: str = ""
    wall_s: float = 0.0
    # newer `where` verdicts on reported changes (`dynamiccl.detector.where_refresh.WhereUpdate`)
    where_updates: list = field(default_factory=list)


def make_retuner(audit_path: str | None):
    """The retuner in dry run: it never writes the tuner config; its audit log goes to ``audit_path``."""
    from dynamiccl.retuner.agent import Retuner
    from dynamiccl.retuner.config import RetunerConfig
    return Retuner(RetunerConfig(dry_run=True, audit_path=audit_path))


def _event_time_ns(ev: np.ndarray) -> np.ndarray:
    """The collector's event time: GPU start for kernel-timed records, else the enqueue time."""
    from dynamiccl.collector.wire_format import TimingSource
    gpu = ev["timing_source"] == TimingSource.KERNEL_GPU
    return np.where(gpu, ev["gpu_start_ns"], ev["enqueue_ns"]).view(np.int64)


def _file_start_ns(path: str) -> int:
    """A lower bound on a part file's first event time (footer statistics of ``enqueue_ns``, which
    never follows a record's GPU start; 0 when absent: the file is then opened at once)."""
    import pyarrow.parquet as pq
    try:
        meta = pq.ParquetFile(path).metadata
        col = meta.schema.to_arrow_schema().get_field_index("enqueue_ns")
        lows = [meta.row_group(g).column(col).statistics for g in range(meta.num_row_groups)]
        return int(min(st.min for st in lows)) if lows and all(st is not None and st.has_min_max
                                                                for st in lows) else 0
    except Exception:  # unreadable footers are the inventory's business; order them first
        return 0


class EventTimeMerge:
    """Yields the records of many part files as ``RecordBatch`` es in event-time order, one batch
    per (window, host, job): every record of window w is handed over before any of window w + 1.

    Rule: a file's unread records start no earlier than the first event time of the last batch
    read from it (a part file is in arrival order), so windows below the minimum of that bound
    over the open files (and the start of the next unopened file) are complete and are emitted.
    The file furthest behind is read next; files are opened when the merge reaches their start,
    so about one read batch per file that overlaps in time is held. Reading a whole file (or a
    low-rate run's 8,192-row batch spanning minutes) per host ahead of the others made the
    collector drop the others' records as late.
    """

    def __init__(self, paths, *, window_ns: int, batch_rows: int = 8192):
        self.window_ns = int(window_ns)
        self.batch_rows = batch_rows
        self._pending = [(_file_start_ns(p), i, p) for i, p in enumerate(paths)]
        heapq.heapify(self._pending)
        self._groups: dict[tuple[str, str], int] = {}
        self._names: list[dict[int, str]] = []
        self._pool: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (events, t, group)
        self.errors: list[tuple[str, str]] = []
        self.records_read = 0

    def __iter__(self):
        from dynamiccl.collector.receivers.replay import read_batches
        active: dict[int, list] = {}  # file index -> [batch iterator, lower bound of unread, path]
        emitted_upto = None
        while self._pending or active:
            bound = min((a[1] for a in active.values()), default=None)
            while self._pending and (bound is None or self._pending[0][0] <= bound):
                start, i, path = heapq.heappop(self._pending)
                active[i] = [read_batches(path, batch_rows=self.batch_rows), start, path]
                bound = start if bound is None else min(bound, start)
            i = min(active, key=lambda k: active[k][1])
            self._advance(active, i)
            low = min([a[1] for a in active.values()] + [p[0] for p in self._pending[:1]], default=None)
            upto = None if low is None else low // self.window_ns  # windows < upto are complete
            if upto is None or emitted_upto is None or upto > emitted_upto:
                emitted_upto = upto
                yield from self._emit(upto)

    def _advance(self, active: dict, i: int) -> None:
        it, _, path = active[i]
        try:
            batch = next(it)
        except StopIteration:
            del active[i]
            return
        except Exception as exc:  # a damaged part file: what was read stays, the rest is skipped
            log.error("replay: skipping the rest of %s: %s", path, exc)
            self.errors.append((path, str(exc)))
            del active[i]
            return
        if not len(batch.events):
            return
        t = _event_time_ns(batch.events)
        g = self._groups.setdefault((batch.host, batch.job_id), len(self._groups))
        if g == len(self._names):
            self._names.append({})
        self._names[g].update(batch.comm_names)
        self._pool.append((batch.events, t, np.full(len(t), g, np.int32)))
        self.records_read += len(t)
        active[i][1] = max(active[i][1], int(t.min()))

    def _emit(self, upto: int | None):
        """Hand over the pooled records of windows < ``upto`` (all when None), window by window."""
        from dynamiccl.collector.component import RecordBatch
        if not self._pool:
            return
        ev = np.concatenate([p[0] for p in self._pool])
        t = np.concatenate([p[1] for p in self._pool])
        g = np.concatenate([p[2] for p in self._pool])
        w = t // self.window_ns
        ready = np.ones(len(t), bool) if upto is None else w < upto
        if not ready.any():
            self._pool = [(ev, t, g)]
            return
        rest = ~ready
        self._pool = [(ev[rest], t[rest], g[rest])] if rest.any() else []
        ev, t, g, w = ev[ready], t[ready], g[ready], w[ready]
        order = np.lexsort((t, g, w))
        ev, g, w = ev[order], g[order], w[order]
        cut = np.flatnonzero((np.diff(w) != 0) | (np.diff(g) != 0)) + 1
        hosts = list(self._groups)
        for lo, hi in zip(np.r_[0, cut], np.r_[cut, len(ev)]):
            host, job = hosts[int(g[lo])]
            yield RecordBatch(ev[lo:hi], host, job, self._names[int(g[lo])])


def replay(parquet_dir: str, detector_config: DetectorConfig, *, window_s: float | None = None,
           lateness_s: float = 30.0, batch_rows: int = 8192, on_change=None, retuner: bool = True,
           audit_path: str | None = None, detector=None) -> ReplayResult:
    """Replay ``parquet_dir`` through window aggregation → detector (→ retuner in dry run, which sees
    every window and every regime change; its audit log goes to ``audit_path`` if given). ``detector``:
    anything with ``process(wf) -> list[RegimeChange]``; None: the service's ``Detector(detector_config)``.
    ``window_s`` None: the collector's default (``WindowConfig().window_s``), so a replay windows the
    records the way a live collector at defaults does."""
    from dynamiccl.collector.component import FuncConsumer, RecordBatch
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.collector.metrics import SelfMetrics
    from dynamiccl.collector.processors.window_agg import WindowAggregator
    from dynamiccl.collector.records import valid_mask
    from dynamiccl.detector.service import Detector
    from dynamiccl.report.inventory import take_inventory

    t0 = time.perf_counter()
    if window_s is None:
        window_s = WindowConfig().window_s
    inv = take_inventory(parquet_dir)
    res = ReplayResult(files=len(inv.files), skipped=list(inv.skipped))
    if not inv.files:
        res.wall_s = time.perf_counter() - t0
        return res
    det = detector if detector is not None else Detector(detector_config)
    res.detector = getattr(det, "name", f"{type(det).__module__}.{type(det).__qualname__}")
    metrics = SelfMetrics()
    rt = make_retuner(audit_path) if retuner else None
    if rt is not None:
        res.retuner = "dynamiccl.retuner.agent.Retuner (dry run)"

    loop = Loop(det, rt, sinks=[res.changes.append] + ([on_change] if on_change is not None else []))

    def on_window(result) -> None:
        res.windows += 1
        res.where_updates.extend(loop.step(result.features).where_updates)

    wcfg = WindowConfig(window_s=window_s, allowed_lateness_s=lateness_s)
    agg = WindowAggregator(wcfg, next_consumer=FuncConsumer(on_window), metrics=metrics)
    def ingest(batch: RecordBatch) -> int:
        ok = valid_mask(batch.events)
        n_ok = int(ok.sum())
        res.invalid += len(batch.events) - n_ok
        if n_ok < len(batch.events):
            batch = RecordBatch(batch.events[ok], batch.host, batch.job_id, batch.comm_names)
        if n_ok:
            agg.consume(batch)
        return n_ok

    merge = EventTimeMerge([f.path for f in inv.files], window_ns=int(round(window_s * 1e9)),
                           batch_rows=batch_rows)
    for batch in merge:
        res.records += ingest(batch)
    res.skipped.extend(merge.errors)
    agg.shutdown()  # closes the windows still open → detector
    if rt is not None:
        res.decisions = list(rt.audit.recent)
        rt.close()
    res.late = int(metrics.dropped.get("late", 0)) + int(metrics.dropped.get("too_early", 0))
    res.wall_s = time.perf_counter() - t0
    return res


# ---------------------------------------------------------------------------------------------
def add_detector_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("window aggregation (collector)")
    g.add_argument("--window", type=float, default=None, metavar="S",
                   help="window length, s of event time (default the collector's window.window_s)")
    g.add_argument("--lateness", type=float, default=30.0, metavar="S",
                   help="allowed lateness, s (default 30: part files interleave hosts in large batches and "
                        "offline waiting costs nothing; the live collector's default is 2)")
    d = p.add_argument_group("detector (dynamiccl.detector.config.DetectorConfig; defaults are the service's)")
    d.add_argument("--arl0", type=float, default=None, help="windows between false alarms per stream")
    d.add_argument("--warmup", type=int, default=None, help="windows of baseline before monitoring")
    d.add_argument("--deltas", default=None, metavar="D[,D…]", help="CUSUM shift sizes in sigma, e.g. 2,6")
    d.add_argument("--merge", type=float, default=None, metavar="S", help="alarms this close join one change")
    d.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other detector setting by dotted key (repeatable), e.g. --set autoencoder.enabled=false")


def detector_config_from_args(args: argparse.Namespace) -> DetectorConfig:
    changes = parse_overrides(args.set)
    if args.arl0 is not None:
        changes["cusum.arl0"] = args.arl0
    if args.warmup is not None:
        changes["baseline.warmup"] = args.warmup
    if args.merge is not None:
        changes["incidents.merge_s"] = args.merge
    if args.deltas is not None:
        changes.update(parse_overrides([f"cusum.deltas={args.deltas}"], flag="--deltas"))
    return DetectorConfig().with_overrides(changes)


def _write_jsonl(path: str, changes: list[RegimeChange]) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    atomic_write(path, "".join(ch.to_json() + "\n" for ch in changes))


def replay_main(args: argparse.Namespace) -> int:
    from dynamiccl.report.sidecars import CHANGES_FILE, find_sidecar, read_jsonl

    dcfg = _replay_settings(args)
    if args.audit_out and os.path.exists(args.audit_out):
        os.unlink(args.audit_out)  # the audit log appends; a replay writes a fresh one
    res = replay(args.parquet_dir, dcfg, window_s=args.window, lateness_s=args.lateness,
                 retuner=not args.no_retuner, audit_path=args.audit_out)
    for path, why in res.skipped:
        print(f"dynamiccl replay: warning: skipped {path}: {why}", file=sys.stderr)
    if not res.files:
        print(f"dynamiccl replay: error: no readable parquet part files in {args.parquet_dir}", file=sys.stderr)
        return 2
    problems: list[str] = []
    truth_path = args.truth or find_sidecar(args.parquet_dir, "truth.jsonl")
    truth = read_jsonl(truth_path, lambda line: json.loads(line), "truth.jsonl", problems) if truth_path else []
    recorded_path = find_sidecar(args.parquet_dir, CHANGES_FILE)
    recorded = read_jsonl(recorded_path, RegimeChange.from_json, CHANGES_FILE, problems) if recorded_path else []
    for p in problems:
        print(f"dynamiccl replay: warning: {p}", file=sys.stderr)
    print(f"detector: {res.detector}" + (f"; {res.retuner}" if res.retuner else ""))
    print(f"settings: window={args.window:g}s lateness={args.lateness:g}s " + " ".join(
        f"{k}={v}" for k, v in dcfg.overrides().items()) or "(defaults)")
    t0 = None
    if truth:
        t0 = min(e.get("t_start_ns", 0) for e in truth) / 1e9 - min(e.get("t_start", 0) for e in truth)
    rel = (lambda t: f"{t - t0:8.1f}") if t0 is not None else (lambda t: f"{t:.1f}")
    unmatched = _print_changes(res, truth, rel)
    missed = _print_truth(res, truth, rel)
    if recorded_path:
        print(f"recorded run had {len(recorded)} change(s) in {recorded_path}; this replay found {len(res.changes)}")
    if res.retuner:
        _print_decisions(res, rel, args.audit_out)
    if args.out:
        _write_jsonl(args.out, res.changes)
        print(f"changes written: {args.out}")
    print(f"changes={len(res.changes)} windows={res.windows} records={res.records} invalid={res.invalid} "
          f"late={res.late} files={res.files} skipped_files={len(res.skipped)} "
          + (f"truth_missed={missed} unmatched={unmatched} " if truth else "")
          + (f"decisions={len(res.decisions)} " if res.retuner else "")
          + f"wall_s={res.wall_s:.2f}")
    return 0


def _replay_settings(args: argparse.Namespace):
    """The detector settings of the command line, the window and lateness checked (the collector's
    window when none is given)."""
    if not os.path.exists(args.parquet_dir):
        raise FileNotFoundError(f"no such file or directory: {args.parquet_dir}")
    dcfg = detector_config_from_args(args)
    if args.window is None:
        from dynamiccl.collector.config import WindowConfig
        args.window = WindowConfig().window_s
    if not args.window > 0 or args.lateness < 0:
        raise ValueError("--window must be > 0 and --lateness >= 0")
    return dcfg


def _print_changes(res, truth: list, rel) -> int:
    """One line per change found, with the truth it matches; returns how many match none."""
    from dynamiccl.report.tables import change_rows

    rows = change_rows(res.changes, truth)
    for r in rows:
        print(f"  {r['id']:<24} {r['kind']:<10} onset {rel(r['start_s'])} s  detected {rel(r['detected_s'])} s  "
              f"×{r['magnitude']:.3g}  {r['where']}" + (f"  = truth {r['truth']} (+{r['truth_delay_s']:.1f} s)"
                                                        if r["truth"] else ""))
    return sum(1 for r in rows if truth and r["truth"] is None)


def _print_truth(res, truth: list, rel) -> int:
    """One line per ground-truth event with its first detection; returns the non-benign ones missed."""
    from dynamiccl.report.tables import fmt_seconds, truth_rows

    missed = 0
    if truth:
        print("ground truth:")
        for r in truth_rows(truth, res.changes):
            if not r["benign"] and r["change"] is None:
                missed += 1
            print(f"  {r['kind']:<12} {'(benign)' if r['benign'] else '':<9} onset {rel(r['start_s'])} s  "
                  + (f"detected after {fmt_seconds(r['delay_s'])} ({r['change']})" if r["change"] else "not detected"))
    return missed


def _print_decisions(res, rel, audit_out) -> None:
    """The dry-run retuner's decisions: counts per action, then each one that changes or keeps a config."""
    from collections import Counter

    counts = Counter(d.get("action") for d in res.decisions)
    print(f"retuner (dry run): {len(res.decisions)} decisions: "
          + (", ".join(f"{a}={n}" for a, n in sorted(counts.items())) or "none"))
    for d in res.decisions:
        if d.get("action") in ("commit", "rollback", "confirmed", "keep", "revert", "reuse"):
            t = d.get("t")
            print(f"  {rel(t) if isinstance(t, (int, float)) else '-':>8} s  {d.get('action'):<9} "
                  f"{d.get('target', '')}  {d.get('candidate', d.get('incumbent', ''))}"
                  + (f"  gain {d['gain']:.3g}" if isinstance(d.get("gain"), (int, float)) else "")
                  + (f"  expected {d['expected_gain']:.3g}" if isinstance(d.get("expected_gain"), (int, float)) else ""))
    if audit_out:
        print(f"retuner audit log written: {audit_out}")
