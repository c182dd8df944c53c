"""Bad input on real records: a labelled corpus run replayed with one fault injected into its
records, scored against the same run replayed clean.

The faults the detector must take without a regime change of their own (issue 17, "Bad
input"), each injected at the quietest point of the run (the middle of the longest span between
two labelled onsets, so that neither neighbour's detection is at stake):

* ``pause``: the whole job stops for 30 s between two collectives (a checkpoint) and carries on;
  the labelled onsets after it move with it;
* ``jump`` / ``jumpback``: one host's clock steps 5 s ahead / back (an NTP step), its
  records' durations unchanged;
* ``vanish``: one rank's records stop (its node collector or plugin died), the job goes on;
* ``join``: one rank's records start only then (its plugin attached late);
* ``absurd``: 1 % of the records get an absurd (+11 days) or negative duration.

A fault is handled when the perturbed replay reports the run's labelled changes within
``MATCH_S`` about as well as the clean one and raises no false alarm the clean one did not.
`benchmarks/bad_input_replay.py` runs it over a corpus half.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

__all__ = ["FAULTS", "RunResult", "quiet_point", "inject", "replay_run"]

FAULTS = ("pause", "jump", "jumpback", "vanish", "join", "absurd")
TIMES = ("enqueue_ns", "gpu_start_ns", "gpu_end_ns", "cpu_end_ns")
PAUSE_S = 30.0
STEP_S = 5.0
ABSURD_SHARE = 0.01
_CATEGORICAL = ("host", "comm_name", "job_id")


@dataclass
class RunResult:
    seed: int
    fault: str
    changes: int
    detected: int
    false_alarms: int
    at_s: float                 # where the fault was injected, s after the run's t0
    false: list[tuple[float, str]] = field(default_factory=list)


def quiet_point(events: list[dict]) -> float:
    """Epoch seconds of the middle of the longest span between two successive labelled onsets."""
    ons = sorted(e["onset_wall"] for e in events)
    if len(ons) < 2:
        raise ValueError("a run needs two labelled changes to place a fault between them")
    _, mid = max((b - a, (a + b) / 2) for a, b in zip(ons, ons[1:]))
    return float(mid)


def _shift(df: pl.DataFrame, mask: pl.Expr, dt_ns: int) -> pl.DataFrame:
    return df.with_columns(
        pl.when(mask & (pl.col(c) > 0)).then(pl.col(c).cast(pl.Int64) + dt_ns)
        .otherwise(pl.col(c).cast(pl.Int64)).cast(pl.UInt64).alias(c) for c in TIMES)


def _second_rank(df: pl.DataFrame) -> int:
    ranks = sorted(df.get_column("rank").unique().to_list())
    return int(ranks[1] if len(ranks) > 1 else ranks[0])


def inject(fault: str, df: pl.DataFrame, events: list[dict], at: float, seed: int = 0
           ) -> tuple[pl.DataFrame, list[dict]]:
    """``df`` (a run's records) and ``events`` (its labelled changes) with ``fault`` injected at
    epoch second ``at``; the rank or host hit is the run's second rank (its own host)."""
    after = pl.col("enqueue_ns") >= int(at * 1e9)
    rank = pl.col("rank") == _second_rank(df)
    events = [dict(e) for e in events]
    if fault == "pause":
        # between collectives, as a checkpoint is: every rank of an instance started before it
        # finishes it first (a rank waiting 30 s for its peers is a hang, not a pause)
        first = pl.col("enqueue_ns").min().over("comm_hash", "seq_number")
        df = _shift(df, first >= int(at * 1e9), int(PAUSE_S * 1e9))
        for e in events:
            if e["onset_wall"] >= at:
                e["onset_wall"] += PAUSE_S
                e["applied_wall"] += PAUSE_S
    elif fault in ("jump", "jumpback"):
        df = _shift(df, after & rank, int((STEP_S if fault == "jump" else -STEP_S) * 1e9))
    elif fault == "vanish":
        df = df.filter(~(after & rank))
    elif fault == "join":
        df = df.filter(after | ~rank)
    elif fault == "absurd":
        rng = np.random.default_rng(seed)
        bad = pl.Series(rng.random(df.height) < ABSURD_SHARE)
        up = pl.Series(rng.random(df.height) < 0.5)
        df = df.with_columns(pl.when(bad & up).then(pl.col("enqueue_ns") + int(1e15))
                             .when(bad).then(pl.col("enqueue_ns") - 1)
                             .otherwise(pl.col("cpu_end_ns")).alias("cpu_end_ns"))
    elif fault != "clean":
        raise ValueError(f"unknown fault {fault!r}; known: clean, {', '.join(FAULTS)}")
    return df.sort("enqueue_ns"), events


def _write(df: pl.DataFrame, dst: Path) -> None:
    """One part file in the layout the collector writes (job_id=/date=/hour=)."""
    job = str(df.get_column("job_id")[0])
    part = dst / f"job_id={job}" / "date=2000-01-01" / "hour=0"
    shutil.rmtree(dst, ignore_errors=True)
    part.mkdir(parents=True)
    df.with_columns(pl.col(c).cast(pl.Categorical) for c in _CATEGORICAL).write_parquet(part / "part-0.parquet")


def replay_run(seed: int, run_dir: Path, fault: str, work: Path, config=None) -> RunResult:
    """Replay corpus run ``run_dir`` with ``fault`` injected (``clean``: none) and score it."""
    from dynamiccl.detector.config import DetectorConfig
    from dynamiccl.harness.corpus import MATCH_S, _relabel
    from dynamiccl.harness.testbed.controller import TruthEvent
    from dynamiccl.harness.testbed.score import Detection, score
    from dynamiccl.report.replay import replay

    truth = json.loads((run_dir / "truth.json").read_text())
    at = quiet_point(truth["events"])
    df = pl.read_parquet(run_dir / "records").with_columns(pl.col(c).cast(pl.Utf8) for c in _CATEGORICAL)
    df, events = inject(fault, df, truth["events"], at, seed)
    dst = work / f"{fault}-{seed:03d}"
    _write(df, dst)
    try:
        res = replay(str(dst), config or DetectorConfig(), retuner=False)
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    sc = score([TruthEvent(**_relabel(e)) for e in events],
               [Detection.from_change(rc, rc.detected_s) for rc in res.changes], match_s=MATCH_S)
    t0 = truth["t0_wall"]
    return RunResult(seed, fault, sc.changes, sc.detected, sc.false_alarms, round(at - t0, 1),
                     [(round(f["detection"]["wall_s"] - t0, 1), f["why"]) for f in sc.false])
