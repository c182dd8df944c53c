"""``dynamiccl report`` (HTML report of a recorded run) and ``dynamiccl replay`` (what-if detection).

    dynamiccl report runs/demo/parquet [-o report.html] [--bin 10]
    dynamiccl replay runs/demo/parquet [--window 1] [--warmup 20] [--arl0 1e4] [--set GROUP.NAME=VALUE]
                     [--out RUN/changes.jsonl] [--audit-out RUN/retuner-audit.jsonl] [--no-retuner]

Both print a last line of ``key=value`` pairs. Exit status 2 on unusable input (clear message on
stderr), 0 otherwise — also when some files were skipped (they are listed in the report).
"""
from __future__ import annotations

import argparse
import sys
import time

__all__ = ["register", "report_cmd", "replay_cmd"]


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="write a self-contained HTML report of a recorded run",
                              description="Write one self-contained HTML report (plots and tables) of a "
                                          "recorded run's parquet history.")
    p.add_argument("parquet_dir", help="parquet history directory (e.g. runs/demo/parquet) or one part file")
    p.add_argument("-o", "--output", default=None, help="HTML file to write (default: report.html in the run directory)")
    p.add_argument("--bin", type=float, default=None, metavar="S",
                   help="time bin in seconds (default: a round value giving about 400 bins)")
    p.add_argument("--sample-records", type=int, default=1_000_000, metavar="N",
                   help="records of whole instances sampled for the spread/straggler views (default 1,000,000)")
    p.add_argument("--changes", default=None, help="regime changes JSONL (default: changes.jsonl found next to the run)")
    p.add_argument("--audit", default=None, help="retuner audit JSONL (default: retuner-audit.jsonl found next to the run)")
    p.add_argument("--truth", default=None, help="ground truth JSONL (default: truth.jsonl or sim/truth.jsonl)")
    p.add_argument("--title", default=None)
    from dynamiccl.progress import add_progress_flag
    add_progress_flag(p)
    p.set_defaults(func=report_cmd)

    r = subparsers.add_parser("replay", help="re-run the detector over a recorded run with other settings",
                              description="Replay a recorded run's parquet history through the collector's window "
                                          "aggregation and the detector (what-if detection).")
    r.add_argument("parquet_dir", help="parquet history directory or one part file")
    from dynamiccl.report.replay import add_detector_args
    add_detector_args(r)
    r.add_argument("--out", default=None, metavar="FILE",
                   help="write the regime changes as JSONL (e.g. RUN/changes.jsonl, which `dynamiccl report` reads)")
    r.add_argument("--truth", default=None, help="ground truth JSONL to score against (default: found next to the run)")
    r.add_argument("--no-retuner", action="store_true", help="detection only (default: also the retuner, in dry run)")
    r.add_argument("--audit-out", default=None, metavar="FILE",
                   help="write the dry-run retuner's audit log (e.g. RUN/retuner-audit.jsonl, which `dynamiccl report` reads)")
    r.set_defaults(func=replay_cmd)


def _default_output(parquet_dir: str) -> str:
    from pathlib import Path
    p = Path(parquet_dir)
    base = p.parent if p.is_file() else p
    return str((base.parent if base.name == "parquet" else base) / "report.html")


def report_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.report.html import write_report
    from dynamiccl.report.sidecars import load_sidecars
    from dynamiccl.report.summary import ScanConfig, summarise

    from dynamiccl.progress import enabled_for, progress
    t0 = time.perf_counter()
    cfg = ScanConfig(bin_s=args.bin, sample_records=args.sample_records).validate()
    # three stages (scan the history, read the sidecars, write the HTML): the scan dominates on a large run
    with progress(3, "report", enabled=enabled_for(args)) as step:
        summ = summarise(args.parquet_dir, cfg)  # FileNotFoundError → exit 2 via dynamiccl.cli
        step()
        side = load_sidecars(args.parquet_dir, changes=args.changes, audit=args.audit, truth=args.truth)
        step()
        for p in summ.problems + side.problems:
            print(f"dynamiccl report: warning: {p}", file=sys.stderr)
        if summ.empty:
            why = "; ".join(summ.problems) or "no records"
            print(f"dynamiccl report: error: nothing to report in {args.parquet_dir}: {why}", file=sys.stderr)
            return 2
        out = write_report(summ, side, args.output or _default_output(args.parquet_dir), title=args.title)
        step()
    wall = time.perf_counter() - t0
    print(f"report written: {out}")
    print(f"records={summ.records} files={len(summ.inventory.files)} skipped_files={len(summ.inventory.skipped)} "
          f"changes={len(side.changes)} decisions={len(side.decisions)} bin_s={summ.bin_s:g} "
          f"sample_k={summ.sample_k} wall_s={wall:.2f} out={out}")
    return 0


def replay_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.report.replay import replay_main
    return replay_main(args)
