"""``dynamiccl replay``: a recorded run goes back through the collector's replay receiver and
window aggregation into the detector (and the retuner in dry run), losing nothing."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
from dynamiccl.detector.events import RegimeChange
from dynamiccl.cli import main
from dynamiccl.report.replay import replay
from report_helpers import make_run, read_tables

START = 1_767_225_600.0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    d = make_run(root, records=240_000, rate_per_s=2000.0, chunk_records=40_000, flush_rows=40_000)
    return root, d


def test_replay_is_lossless(run):
    """Every record reaches a window, in one window per second of event time."""
    seen = {"records": 0, "windows": []}

    class Counting:
        name = "counting"

        def __init__(self, cfg):
            pass

        def process(self, wf):
            seen["records"] += int(wf.keys["records"].sum())
            seen["windows"].append(wf.window_start)
            return []

    res = replay(run[1], DetectorConfig(), retuner=False, lateness_s=30.0, detector=Counting(None))
    assert res.records == 240_000 and res.late == 0 and res.invalid == 0
    assert seen["records"] == 240_000
    assert len(seen["windows"]) == res.windows == 120
    assert seen["windows"] == sorted(seen["windows"]) and seen["windows"][0] == START


class _Counting:
    """A detector stand-in that counts the records and windows it is given."""
    name = "counting"

    def __init__(self, cfg=None):
        self.records = 0
        self.windows: list[float] = []

    def process(self, wf):
        self.records += int(wf.keys["records"].sum())
        self.windows.append(wf.window_start)
        return []


@pytest.mark.parametrize("lateness_s", [30.0, 0.0])
def test_replay_low_rate_run_loses_nothing(tmp_path, lateness_s):
    """100 records/s: one 8,192-row read batch spans ~80 s of one host's records, and the part
    files hold both hosts interleaved. Records are fed in event-time order across hosts, so
    none is late, not even with zero allowed lateness (before: 6,636 of 30,000 dropped)."""
    d = make_run(tmp_path, records=30_000, rate_per_s=100.0, chunk_records=10_000, flush_rows=10_000)
    det = _Counting()
    res = replay(d, DetectorConfig(), retuner=False, lateness_s=lateness_s, detector=det)
    assert (res.records, res.late, res.invalid) == (30_000, 0, 0)
    assert det.records == 30_000 and res.windows == len(det.windows) == 300
    assert det.windows == sorted(det.windows)


def _feed_live(run_dir, agg) -> None:
    """What a live collector sees of a run: its records in event-time order, arriving every 100 ms of event
    time, each host's batch in turn; then the aggregator closes its windows."""
    from dynamiccl.collector.component import RecordBatch
    from dynamiccl.collector.wire_format import TimingSource
    from dynamiccl.harness.synthetic_run import COMMS, JOB_ID, RANKS_PER_HOST
    from report_helpers import part_files, raw_events
    ev = raw_events(part_files(run_dir))
    t = np.where(ev["timing_source"] == TimingSource.KERNEL_GPU, ev["gpu_start_ns"], ev["enqueue_ns"])
    ev, t = ev[np.argsort(t, kind="stable")], np.sort(t)
    names = {c.comm_hash: c.name for c in COMMS}
    host = (ev["pid"] - 1000 >= RANKS_PER_HOST).astype(int)
    sec = (t // 10**8).astype(np.int64)
    for s in np.unique(sec):
        for h in (0, 1):
            m = (sec == s) & (host == h)
            if m.any():
                agg.consume(RecordBatch(ev[m], f"node{h}", JOB_ID, names))
    agg.shutdown()


def test_replay_gives_the_live_changes(tmp_path):
    """Replay and a live collector (records arriving in event-time order, per host) produce the
    same windows, hence the same regime changes, from the same records."""
    from dynamiccl.collector.component import FuncConsumer
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.collector.processors.window_agg import WindowAggregator
    from dynamiccl.detector.service import Detector

    d = make_run(tmp_path, records=120_000, rate_per_s=1000.0, chunk_records=40_000, flush_rows=40_000)
    cfg = DetectorConfig(baseline=BaselineConfig(warmup=20), autoencoder=AutoencoderConfig(enabled=False))
    replayed = replay(d, cfg, retuner=False).changes
    det, live = Detector(cfg), []
    agg = WindowAggregator(WindowConfig(window_s=1.0, allowed_lateness_s=2.0),
                           next_consumer=FuncConsumer(lambda r: live.extend(det.process(r.features))))
    _feed_live(d, agg)
    key = lambda c: (c.kind, c.start_s, c.detected_s, c.comm_names, c.ranks)  # noqa: E731
    assert live and [key(c) for c in replayed] == [key(c) for c in live]


def test_replay_cli_detects_and_feeds_the_report(run, tmp_path, capsys):
    """The replay runs the service's detector (the only one) and the retuner in dry run."""
    root, d = run
    out = tmp_path / "run"
    shutil.copytree(d, out / "parquet")
    shutil.copy(root / "truth.jsonl", out / "truth.jsonl")
    rc = main(["replay", str(out / "parquet"), "--warmup", "20", "--deltas", "3",
               "--out", str(out / "changes.jsonl"), "--audit-out", str(out / "retuner-audit.jsonl")])
    text = capsys.readouterr().out
    assert rc == 0
    last = dict(kv.split("=", 1) for kv in text.strip().splitlines()[-1].split())
    assert last["records"] == "240000" and last["windows"] == "120" and last["late"] == "0"
    changes = [RegimeChange.from_json(x) for x in (out / "changes.jsonl").read_text().splitlines()]
    assert len(changes) == int(last["changes"])
    # the 2.5x inter-node bandwidth drop at 36 s (30 % of 120 s) is found within 5 s
    drop = [c for c in changes if c.kind != "recovery" and START + 36 <= c.detected_s <= START + 41]
    assert drop, [(c.kind, c.detected_s - START) for c in changes]
    assert any(n.startswith("dp") for n in drop[0].comm_names)
    assert "bw_drop" in text and "detected after" in text
    # the retuner ran in dry run and its audit log is what the report shows
    audit = [json.loads(x) for x in (out / "retuner-audit.jsonl").read_text().splitlines()]
    assert audit and all(a["dry_run"] is True for a in audit)
    assert int(last["decisions"]) == len(audit)
    assert main(["report", str(out / "parquet")]) == 0
    tables = read_tables((out / "report.html").read_text())
    assert len(tables["changes"]) == len(changes)
    assert len(tables["decisions"]) == len(audit)


def test_replay_runs_the_service_detector_without_the_retuner(run, tmp_path, capsys):
    out = tmp_path / "changes.jsonl"
    rc = main(["replay", run[1], "--warmup", "20", "--set", "autoencoder.enabled=false",
               "--no-retuner", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and "detector: dynamiccl.detector.service.Detector\n" in text
    last = dict(kv.split("=", 1) for kv in text.strip().splitlines()[-1].split())
    assert last["records"] == "240000" and last["windows"] == "120" and "decisions" not in last
    assert len(out.read_text().splitlines()) == int(last["changes"])


def test_replay_settings_errors(run, capsys):
    assert main(["replay", run[1], "--set", "no_such_field=1"]) == 2
    err = capsys.readouterr().err
    assert "no_such_field" in err and "cusum.arl0" in err  # names the known fields
    assert main(["replay", run[1], "--set", "warmup=30"]) == 2     # a flat key names its dotted one
    assert "'warmup' is now 'baseline.warmup'" in capsys.readouterr().err
    assert main(["replay", run[1], "--set", "baseline.warmup=lots"]) == 2
    assert "cannot read 'lots' as int" in capsys.readouterr().err
    assert main(["replay", run[1], "--warmup", "1"]) == 2
    assert "baseline.warmup must be >= 2" in capsys.readouterr().err


def test_replay_empty_directory(tmp_path, capsys):
    assert main(["replay", str(tmp_path)]) == 2
    assert "no readable parquet part files" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "nope")]) == 2


def test_replay_live_and_the_split_services_make_the_same_decisions(tmp_path):
    """The same records give the same regime changes and the same retuner decisions (dry run) in a replay,
    in a live in-process loop fed as the collector feeds it, and in the split services' arrangement (the
    retuner receives windows and changes on two streams, the changes out of step; the service's
    ChangeOrder puts them back in the loop's order)."""
    from dynamiccl.collector.component import FuncConsumer
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.collector.processors.window_agg import WindowAggregator
    from dynamiccl.detector.service import Detector
    from dynamiccl.loop import ChangeOrder, Loop
    from dynamiccl.retuner.agent import Retuner
    from dynamiccl.retuner.config import RetunerConfig

    d = make_run(tmp_path, records=120_000, rate_per_s=1000.0, chunk_records=40_000, flush_rows=40_000)
    cfg = DetectorConfig(baseline=BaselineConfig(warmup=20), autoencoder=AutoencoderConfig(enabled=False))
    rep = replay(d, cfg, retuner=True)

    # live: the collector's aggregation fed per host every 100 ms of event time, through the one loop
    live_rt, windows, live = Retuner(RetunerConfig(dry_run=True)), [], []
    loop = Loop(Detector(cfg), live_rt, sinks=[live.append])

    def on_window(r):
        windows.append(r.features)
        loop.step(r.features)

    agg = WindowAggregator(WindowConfig(window_s=1.0, allowed_lateness_s=2.0), next_consumer=FuncConsumer(on_window))
    _feed_live(d, agg)

    # split: the detector's changes reach the retuner up to two windows early (a detector ahead of the
    # retuner's feature reader), the windows in order; ChangeOrder restores the loop's order
    split_rt, order = Retuner(RetunerConfig(dry_run=True)), ChangeOrder()
    pending = list(live)
    for i, wf in enumerate(windows):
        ahead = wf.window_start + wf.window_s + 2.0
        while pending and pending[0].detected_s <= ahead:
            for kind, x in order.change(pending.pop(0)):
                split_rt.on_change(x)
        for kind, x in order.window(wf):
            (split_rt.on_window if kind == "window" else split_rt.on_change)(x)

    key = lambda c: (c.kind, c.start_s, c.detected_s, c.comm_names, c.ranks)  # noqa: E731
    def decision(a: dict) -> dict:   # ts is the wall clock; floats to 9 digits (sums in another order)
        r = lambda v: float(f"{v:.9g}") if isinstance(v, float) else v  # noqa: E731
        return {k: ({kk: r(vv) for kk, vv in v.items()} if isinstance(v, dict) else r(v))
                for k, v in a.items() if k != "ts"}

    assert live and [key(c) for c in rep.changes] == [key(c) for c in live]
    assert rep.decisions, "the retuner decided nothing: the comparison would be empty"
    assert [decision(a) for a in rep.decisions] == [decision(a) for a in live_rt.audit.recent]
    assert [decision(a) for a in split_rt.audit.recent] == [decision(a) for a in live_rt.audit.recent]
