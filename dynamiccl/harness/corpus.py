"""The labelled test-bed corpus: load it, replay it the way ``dynamiccl replay`` does, score it.

A corpus is a folder (or a ``.tar.xz`` of one) of runs ``seed-NNN/`` recorded by
``python -m dynamiccl.harness.testbed.generate record``; each holds ``truth.json`` (the labelled
changes, epoch seconds) and ``records/`` (the collector's parquet part files). Runs are split by
seed (:func:`dynamiccl.harness.testbed.generate.split`): even seeds are the development half,
odd seeds the evaluation half. Format and licence: docs/corpus.md.

Each run is replayed with :func:`dynamiccl.report.replay.replay` at the replay CLI's defaults
(the collector's default window, 30 s lateness, ``DetectorConfig()``) — the code path of ``dynamiccl replay`` — and
its regime changes are matched to the truth by :func:`dynamiccl.harness.testbed.score.score`
(a change is reported when a change of its direction is emitted within ``MATCH_S`` of its onset;
the emission time is the change's ``detected_s``, the event time of the end of the window that
triggered it: the test bed's ranks share the host clock). Every other change is a false alarm.
Localisation of single-rank / single-link changes is the detector's own verdict on the matched
change (``evidence["where"]``, from the windows' rank offsets: `dynamiccl.detector.where`, or the
newest `WhereUpdate` on it handed out within ``MATCH_S`` of the true onset:
`dynamiccl.detector.where_refresh`); the
same rules on the records around the true onset (:func:`dynamiccl.detector.localise.localise`)
give the figure of localisation alone. A secondary figure, labelled as such on the line
(``testbed_effective_changes``, ``testbed_within_5s_effective``): the share reported within 5 s of
the changes that moved collective latency at all, judged from the records alone with the detector's
documented smallest change (:mod:`dynamiccl.harness.testbed.effect`); ``testbed_within_5s`` stays
the share of all labelled changes.
"""
from __future__ import annotations

import atexit
import json
import math
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RunScore", "load_runs", "score_run", "summarise", "DEFAULT_CORPUS", "MATCH_S"]

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = ROOT / "corpus" / "testbed-corpus.tar.xz"
MATCH_S = 5.0
POST_S = 5.0  # localisation at the true onset looks at this much after it


@dataclass
class RunScore:
    seed: int
    changes: int
    reported: int
    false_alarms: int
    monitored_s: float
    delays_s: list[float] = field(default_factory=list)
    delays_instances: list[float] = field(default_factory=list)
    localisable: int = 0
    localised: int = 0
    localised_at_truth: int = 0
    localised_report: int = 0     # by the report's own verdict, without later `WhereUpdate`s
    rows: list[dict] = field(default_factory=list)
    effective: int = 0            # changes that moved collective latency (`testbed.effect`)
    effective_within: int = 0     # ... reported within MATCH_S


_EXTRACTED: list[Path] = []


def cleanup_extracted() -> None:
    """Remove the folders this process unpacked corpus archives into (also run at exit)."""
    while _EXTRACTED:
        shutil.rmtree(_EXTRACTED.pop(), ignore_errors=True)


def _extract(archive: Path) -> Path:
    """Unpack into a fresh temporary folder, removed when the process exits (cleanup_extracted)."""
    out = Path(tempfile.mkdtemp(prefix="dynamiccl-corpus-"))
    if not _EXTRACTED:
        atexit.register(cleanup_extracted)
    _EXTRACTED.append(out)
    with tarfile.open(archive) as tf:
        tf.extractall(out, filter="data")
    subdirs = [p for p in out.iterdir() if p.is_dir()]
    return subdirs[0] if len(subdirs) == 1 and not (subdirs[0] / "truth.json").exists() else out


def _finished(d: Path) -> bool:
    """A run that ended normally: truth and a summary that does not say interrupted."""
    summary = d / "summary.json"
    return ((d / "truth.json").exists() and summary.exists()
            and not json.loads(summary.read_text()).get("interrupted"))


def load_runs(path: Path | str = DEFAULT_CORPUS, half: str | None = "eval") -> list[tuple[int, Path]]:
    """``(seed, run_dir)`` of the corpus's runs with records, in seed order; ``half`` dev / eval / None."""
    from dynamiccl.harness.testbed.generate import split
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"test-bed corpus not found: {path} (docs/corpus.md says how to record one)")
    root = _extract(path) if path.is_file() else path
    runs = []
    for d in sorted(root.glob("seed-*")):
        if not _finished(d) or not any((d / "records").rglob("*.parquet")):
            continue
        seed = int(d.name.split("-", 1)[1])
        if half is None or split(seed) == half:
            runs.append((seed, d))
    return runs


def _relabel(e: dict) -> dict:
    """A softer step of a throttle (more capacity than before) is an improvement: runs recorded
    before the controller labelled it so carry ``degrades: true`` for it."""
    if e["do"] == "throttle" and e.get("mbit_from") is not None and e.get("mbit_to") is not None:
        e = {**e, "degrades": e["mbit_to"] < e["mbit_from"]}
    return e


def names_it(where, event) -> bool:
    """Whether ``where`` names the changed rank or link: the rank itself, or for an egress
    throttle the link out of that rank (its sends are what is slow)."""
    if where is None:
        return False
    r = event.single_rank
    if where.rank == r:
        return True
    return event.direction in ("egress", "both") and where.link is not None and where.link[0] == r


def _live_where(rc, updates=(), until_s: float = math.inf):
    """The detector's own verdict on the change: the newest of its ``evidence["where"]``
    (`dynamiccl.detector.where`) and the `WhereUpdate` verdicts on it handed out by ``until_s`` (the true
    onset + ``MATCH_S``: a verdict counts within the report's own budget), `dynamiccl.detector.where_refresh`."""
    from dynamiccl.detector.localise import Where
    w = (rc.evidence or {}).get("where")
    for u in sorted(updates, key=lambda u: u.detected_s):
        if u.id == rc.id and u.detected_s <= until_s:
            w = u.where
    if not w:
        return None
    link = tuple(w["link"]) if w.get("link") is not None else None
    return Where(w["kind"], int(w["rank"]), link, float(w["confidence"]), w["rule"])


def _instance_rate(records, onset_s: float) -> float:
    """Instances per second of the run's most frequent communicator in the 20 s before ``onset_s``."""
    import polars as pl
    lo, hi = int((onset_s - 20) * 1e9), int(onset_s * 1e9)
    pre = records.filter((pl.col("enqueue_ns") >= lo) & (pl.col("enqueue_ns") < hi) & (pl.col("rank") == 0))
    if pre.height == 0:
        return float("nan")
    return pre.group_by("comm_hash").len()["len"].max() / 20.0


def score_run(seed: int, run_dir: Path, config=None, window_s: float | None = None) -> RunScore:
    """Replay one run at defaults (or ``config``; ``window_s`` None: the collector's default window),
    match its changes to the truth, localise."""
    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.detector.localise import instance_offsets, localise, read_instances
    from dynamiccl.harness.testbed.controller import TruthEvent
    from dynamiccl.harness.testbed.effect import label_run
    from dynamiccl.harness.testbed.score import Detection, score
    from dynamiccl.report.replay import replay

    truth = json.loads((run_dir / "truth.json").read_text())
    events = [TruthEvent(**_relabel(e)) for e in truth["events"]]
    res = replay(str(run_dir / "records"), config or DetectorConfig(), window_s=window_s, retuner=False)
    dets = [Detection.from_change(rc, rc.detected_s) for rc in res.changes]
    sc = score(events, dets, match_s=MATCH_S)
    records = read_instances(run_dir / "records")
    offsets = instance_offsets(records)
    t0 = records["enqueue_ns"].min() / 1e9 if records.height else 0.0
    t1 = records["enqueue_ns"].max() / 1e9 if records.height else 0.0
    out = RunScore(seed, sc.changes, sc.detected, sc.false_alarms, max(0.0, t1 - t0), rows=sc.rows)
    by_id = {rc.id: rc for rc in res.changes}
    effects = label_run(events, run_dir / "records")
    for e, row, eff in zip(sorted(events, key=lambda e: e.onset_wall), sc.rows, effects):
        row.update(effect=eff.rule, effect_ratio=round(eff.ratio, 3), effect_z=round(eff.z, 2))
        out.effective += int(eff.effective)
        out.effective_within += int(eff.effective and row["detected"] and row["delay_s"] <= MATCH_S)
        if row["detected"]:
            out.delays_s.append(row["delay_s"])
            out.delays_instances.append(row["delay_s"] * _instance_rate(records, e.onset_wall))
        if not (e.degrades and e.single_rank is not None):
            continue
        out.localisable += 1
        # localisation on its own: at the true onset, whether or not the change was reported
        at_truth = localise(offsets, onset_s=e.onset_wall, detected_s=e.onset_wall + POST_S)
        row["where_at_truth"] = at_truth.as_dict() if at_truth else None
        out.localised_at_truth += names_it(at_truth, e)
        rc = by_id.get(row.get("id"))
        if rc is None:
            row["localised"] = False
            continue
        where = _live_where(rc, res.where_updates, e.onset_wall + MATCH_S)
        row["where"] = where.as_dict() if where else None
        ok = names_it(where, e)
        out.localised += ok
        row["localised"] = ok
        out.localised_report += names_it(_live_where(rc), e)
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def summarise(scores: list[RunScore]) -> dict:
    changes = sum(s.changes for s in scores)
    within = sum(1 for s in scores for d in s.delays_s if d <= MATCH_S)
    hours = sum(s.monitored_s for s in scores) / 3600
    loc = sum(s.localisable for s in scores)
    eff = sum(s.effective for s in scores)
    return {"effective_changes": eff, "within_5s_effective": sum(s.effective_within for s in scores),
            "within_5s_effective_share": sum(s.effective_within for s in scores) / eff if eff else float("nan"),
            "runs": len(scores), "changes": changes, "within_5s": within,
            "within_5s_share": within / changes if changes else float("nan"),
            "false_alarms": sum(s.false_alarms for s in scores), "monitored_h": hours,
            "false_alarms_per_h": sum(s.false_alarms for s in scores) / hours if hours else float("nan"),
            "median_delay_s": _median([d for s in scores for d in s.delays_s]),
            "median_delay_instances": _median([d for s in scores for d in s.delays_instances]),
            "localisable": loc, "localised": sum(s.localised for s in scores),
            "localise_top1": sum(s.localised for s in scores) / loc if loc else float("nan"),
            "localise_top1_report": sum(s.localised_report for s in scores) / loc if loc else float("nan"),
            "localise_top1_at_truth": sum(s.localised_at_truth for s in scores) / loc if loc else float("nan")}


def line(summary: dict) -> str:
    def f(v, nd=3):
        return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"
    return (f"testbed_runs={summary['runs']} testbed_changes={summary['changes']} "
            f"testbed_within_5s={f(summary['within_5s_share'])} "
            f"testbed_false_alarms_per_h={f(summary['false_alarms_per_h'], 2)} "
            f"testbed_median_delay_s={f(summary['median_delay_s'], 2)} "
            f"testbed_median_delay_instances={f(summary['median_delay_instances'], 1)} "
            f"testbed_localise_top1={f(summary['localise_top1'])} "
            f"testbed_localise_top1_report={f(summary.get('localise_top1_report'))} "
            f"testbed_localise_top1_at_truth={f(summary['localise_top1_at_truth'])} "
            f"testbed_effective_changes={summary.get('effective_changes', 'nan')} "
            f"testbed_within_5s_effective={f(summary.get('within_5s_effective_share'))}")


def run_suite(path: Path | str = DEFAULT_CORPUS, half: str = "eval", config=None, print_fn=print,
              window_s: float | None = None) -> dict:
    runs = load_runs(path, half)
    if not runs:
        raise ValueError(f"test-bed corpus {path}: no runs in the {half} half")
    scores = []
    for seed, d in runs:
        s = score_run(seed, d, config, window_s)
        scores.append(s)
        print_fn(f"  seed {seed}: {s.reported}/{s.changes} reported, {s.false_alarms} false alarms, "
                 f"localised {s.localised}/{s.localisable}")
    summary = summarise(scores)
    summary["half"] = half
    summary["per_run"] = [vars(s) for s in scores]
    return summary


def pack(runs_dir: Path | str, archive: Path | str = DEFAULT_CORPUS) -> int:
    """Write the finished runs of ``runs_dir`` (truth, summary, records; no logs, no windows) to
    ``archive`` (tar.xz, atomically); returns the number of runs packed."""
    import os
    runs_dir, archive = Path(runs_dir), Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + f".tmp.{os.getpid()}")
    n = 0
    with tarfile.open(tmp, "w:xz", preset=9) as tf:
        for d in sorted(runs_dir.glob("seed-*")):
            if not _finished(d):
                continue
            for name in ("truth.json", "summary.json", "records"):
                tf.add(d / name, arcname=f"corpus/{d.name}/{name}")
            n += 1
    os.replace(tmp, archive)
    return n


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m dynamiccl.harness.corpus")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="archive the finished runs of a recording")
    p.add_argument("runs_dir")
    p.add_argument("archive", nargs="?", default=str(DEFAULT_CORPUS))
    s = sub.add_parser("score", help="score one half (the same as dynamiccl detector evaluate --suite testbed)")
    s.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    s.add_argument("--half", choices=("dev", "eval"), default="eval")
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        print(f"packed {pack(args.runs_dir, args.archive)} runs into {args.archive}")
        return 0
    print(line(run_suite(args.corpus, args.half)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
