"""`detector.CUSUM` at defaults against trivial baselines on public labelled data.

Datasets (not shipped: TCPD's series carry their own licences, NAB's data come from many sources;
get them with `git clone https://github.com/alan-turing-institute/TCPD` (its `datasets/*/*.json`
that are committed; the others need its download scripts) and
`git clone https://github.com/numenta/NAB` (`data/`, `labels/combined_windows.json`)):

- TCPD (van den Burg & Williams 2020): univariate series, several annotators. Metrics: its F1 and
  segmentation cover with margin 5, the series start counted as a change point (as in its paper).
- NAB (Lavin & Ahmad 2015): labelled anomaly windows. Metric: the standard-profile score
  (reimplemented: scaled-sigmoid rewards, A_TP=1, A_FP=-0.11, A_FN=-1, probationary 15 %),
  normalised 0 (null detector) .. 100 (perfect) over the split.

Every series is assigned once to `dev` or `eval` by a seeded hash of its name; report `eval`.
Detectors: `CUSUM()` at defaults; never-fire; a plain two-sided CUSUM (k=0.5, h=5) on z-scores
clipped to +/-3 against the mean/std of its first 30 samples, re-learnt after an alarm; a
windowed Gaussian (NAB's own windowedGaussian at its optimised threshold, see `run_windowed_gaussian`).

- RTT (Shao et al. 2017, github.com/WenqinSHAO/rtt, MIT): 50 RIPE Atlas ping traces with 1047
  hand-labelled changes (`dataset/real_trace_labelled`). Metric: mean per-trace F1 with margin 5,
  the detector's own change-location estimate.

Usage: python benchmarks/public_changepoint.py --tcpd PATH --nab PATH --rtt PATH [--split eval]
[--per-file NAB.json]  (each NAB file's hits, misses and alarms outside windows, per detector)
The last line is key=value pairs; pass=1 only if CUSUM beats every baseline on every metric.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamiccl.detector import CUSUM  # noqa: E402

MARGIN = 5
SQRT2 = math.sqrt(2.0)


# ---------------------------------------------------------------- split
def split_of(name: str, seed: int) -> str:
    """Seeded hash split: the same name always lands in the same half."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return "dev" if digest[0] % 2 == 0 else "eval"


def in_split(items, prefix: str, split: str, seed: int) -> list:
    """The (name, series, labels) items of one half, named `<prefix>/<name>` for the hash."""
    return [item for item in items if split_of(f"{prefix}/{item[0]}", seed) == split]


# ---------------------------------------------------------------- detectors
CUSUM_KWARGS: dict = {}  # `--set` ablations; the reported figures use the defaults


def run_cusum(xs):
    det, out = CUSUM(**CUSUM_KWARGS), []
    for i, x in enumerate(xs):
        det.update(x)
        if det.drift_detected:
            out.append((i, det.change_start))
    return out


def run_never(xs):
    return []


def run_plain_cusum(xs, warm=30, k=0.5, h=5.0, clip=3.0):
    out, buf, mu, sd, sp, sm, start_p, start_m = [], [], None, None, 0.0, 0.0, 0, 0
    for i, x in enumerate(xs):
        if not math.isfinite(x):
            continue
        if mu is None:
            buf.append(x)
            if len(buf) == warm:
                mu, sd = float(np.mean(buf)), float(np.std(buf)) or 1e-12
            continue
        z = max(-clip, min(clip, (x - mu) / sd))
        if sp == 0.0:
            start_p = i
        if sm == 0.0:
            start_m = i
        sp, sm = max(0.0, sp + z - k), max(0.0, sm - z - k)
        if sp >= h or sm >= h:
            out.append((i, start_p if sp >= h else start_m))
            buf, mu, sp, sm = [], None, 0.0, 0.0
    return out


def run_windowed_gaussian(xs, window=6400, step=100):
    """NAB's windowedGaussian detector at NAB's optimised standard-profile threshold (1.0):
    mean/std of up to the last `window` values, refreshed every `step` values once full;
    alarm when the score 1 - Q(|z|), written with 12 significant digits as NAB's result files
    are, reads 1.0 (|z| above about 7.1)."""
    v = np.asarray([x for x in xs if math.isfinite(x)], dtype=np.float64)
    idx = [i for i, x in enumerate(xs) if math.isfinite(x)]
    out, mean, std, lo, hi = [], 0.0, 1.0, 0, 0  # the window is v[lo:hi]
    for j, x in enumerate(v):
        if hi > 0 and float(f"{1.0 - 0.5 * math.erfc(abs(x - mean) / std / SQRT2):.12g}") >= 1.0:
            out.append((idx[j], idx[j]))
        if hi - lo < window:
            hi = j + 1
        elif j + 1 - hi == step:
            lo, hi = lo + step, j + 1
        else:
            continue
        w = v[lo:hi]
        mean, std = float(w.mean()), float(w.std()) or 1e-6
    return out


DETECTORS = {"cusum": run_cusum, "never": run_never, "plain_cusum": run_plain_cusum,
             "windowed_gaussian": run_windowed_gaussian}


# ---------------------------------------------------------------- TCPD metrics
def _true_positives(truth, pred, margin=MARGIN):
    """Each true change point matched to at most one prediction within the margin."""
    used, tp = set(), 0
    for t in truth:
        cands = [p for p in pred if abs(p - t) <= margin and p not in used]
        if cands:
            used.add(min(cands, key=lambda p: abs(p - t)))
            tp += 1
    return tp


def tcpd_f1(annotations: dict, pred: list[int], n: int) -> float:
    pred = sorted(set([0] + [p for p in pred if 0 <= p < n]))
    truths = [sorted(set([0] + list(v))) for v in annotations.values()]
    union = sorted(set().union(*truths))
    precision = _true_positives(union, pred) / len(pred)
    recall = float(np.mean([_true_positives(t, pred) / len(t) for t in truths]))
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def _segments(cps, n):
    b = sorted(set([0] + [c for c in cps if 0 < c < n] + [n]))
    return [(b[j], b[j + 1]) for j in range(len(b) - 1)]


def tcpd_cover(annotations: dict, pred: list[int], n: int) -> float:
    def jac(a, b):
        inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
        return inter / (max(a[1], b[1]) - min(a[0], b[0]))
    sp = _segments(pred, n)
    covers = []
    for truth in annotations.values():
        st = _segments(truth, n)
        covers.append(sum((a[1] - a[0]) * max(jac(a, b) for b in sp) for a in st) / n)
    return float(np.mean(covers))


def load_tcpd(root: Path):
    ann = json.loads((root / "annotations.json").read_text())
    for f in sorted((root / "datasets").glob("*/*.json")):
        d = json.loads(f.read_text())
        if d["name"] not in ann or d.get("n_dim", 1) != 1:
            continue
        xs = [float("nan") if v is None else float(v) for v in d["series"][0]["raw"]]
        yield d["name"], xs, ann[d["name"]]


def score_tcpd(root: Path, split: str, seed: int) -> dict:
    sums = {name: [0.0, 0.0] for name in DETECTORS}
    series = in_split(load_tcpd(root), "tcpd", split, seed)
    for _, xs, ann in series:
        for det, fn in DETECTORS.items():
            # Change-point benchmarks score locations: use the detector's own estimate.
            locs = [start for _, start in fn(xs)]
            sums[det][0] += tcpd_f1(ann, locs, len(xs))
            sums[det][1] += tcpd_cover(ann, locs, len(xs))
    n = len(series)
    return {det: (f / n, c / n) for det, (f, c) in sums.items()} | {"_n": n}


# ---------------------------------------------------------------- NAB standard profile
A_TP, A_FP, A_FN = 1.0, -0.11, -1.0
PROBATION = 0.15


def _sigmoid(y: float) -> float:
    return 2.0 / (1.0 + math.exp(5.0 * y)) - 1.0


def nab_raw_score(alarms: list[int], windows: list[tuple[int, int]], n: int) -> float:
    """NAB's scaled-sigmoid score of one file (first alarm per window scores, others ignored)."""
    probation = min(int(math.floor(PROBATION * n)), int(PROBATION * 5000))
    score, hit = 0.0, set()
    for i in sorted(a for a in alarms if a >= probation):
        inside = [w for w in windows if w[0] <= i <= w[1]]
        if inside:
            w = inside[0]
            if w not in hit:
                hit.add(w)
                y = -(w[1] - i) / (w[1] - w[0] + 1)  # -1 at the window start, 0 at its end
                score += A_TP * _sigmoid(y)
            continue
        before = [w for w in windows if w[1] < i]
        if before:
            w = before[-1]
            score += -A_FP * _sigmoid((i - w[1]) / (w[1] - w[0] + 1))
        else:
            score += A_FP
    return score + A_FN * (len(windows) - len(hit))


def load_nab(root: Path):
    import csv
    from datetime import datetime
    labels = json.loads((root / "labels" / "combined_windows.json").read_text())
    fmt = "%Y-%m-%d %H:%M:%S"
    for rel, wins in sorted(labels.items()):
        path = root / "data" / rel
        if not path.exists():
            continue
        with path.open() as fh:
            rows = list(csv.DictReader(fh))
        ts = [row["timestamp"][:19] for row in rows]
        index = {t: i for i, t in enumerate(ts)}
        xs = [float(row["value"]) for row in rows]
        spans = []
        for a, b in wins:
            a, b = a[:19], b[:19]
            ia = index.get(a, min(range(len(ts)), key=lambda j: abs(
                (datetime.strptime(ts[j], fmt) - datetime.strptime(a, fmt)).total_seconds())))
            ib = index.get(b, min(range(len(ts)), key=lambda j: abs(
                (datetime.strptime(ts[j], fmt) - datetime.strptime(b, fmt)).total_seconds())))
            spans.append((ia, ib))
        yield rel, xs, spans


def nab_breakdown(alarms: list[int], windows: list[tuple[int, int]], n: int) -> dict:
    """One file's losses by the scorer's rules: windows hit (and where in the window, 0 = its
    start, 1 = its end), windows missed, alarms outside windows (after a window or not)."""
    probation = min(int(math.floor(PROBATION * n)), int(PROBATION * 5000))
    scored = sorted(a for a in alarms if a >= probation)
    first = {w: min((a for a in scored if w[0] <= a <= w[1]), default=None) for w in windows}
    outside = [a for a in scored if not any(w[0] <= a <= w[1] for w in windows)]
    return {"raw": nab_raw_score(alarms, windows, n), "n": n, "windows": [list(w) for w in windows],
            "hit_at": [None if a is None else round((a - w[0]) / max(1, w[1] - w[0]), 3)
                       for w, a in first.items()],
            "missed": sum(a is None for a in first.values()), "outside": len(outside),
            "outside_after_window": sum(any(w[1] < a for w in windows) for a in outside),
            "in_probation": len(alarms) - len(scored), "alarms": sorted(alarms)}


PER_FILE: dict = {}  # `--per-file PATH`: NAB file -> detector -> `nab_breakdown`


def score_nab(root: Path, split: str, seed: int) -> dict:
    raw = {name: 0.0 for name in DETECTORS}
    perfect = null = 0.0
    files = in_split(load_nab(root), "nab", split, seed)
    for rel, xs, spans in files:
        perfect += nab_raw_score([a for a, _ in spans], spans, len(xs))
        null += nab_raw_score([], spans, len(xs))
        for det, fn in DETECTORS.items():
            alarms = [i for i, _ in fn(xs)]
            raw[det] += nab_raw_score(alarms, spans, len(xs))
            PER_FILE.setdefault(rel, {})[det] = nab_breakdown(alarms, spans, len(xs))
    return {det: 100.0 * (r - null) / (perfect - null) for det, r in raw.items()} | {"_n": len(files)}


# ---------------------------------------------------------------- RTT (Shao et al. 2017)
def load_rtt(root: Path):
    """`dataset/real_trace_labelled/*.csv` of WenqinSHAO/rtt: `epoch;rtt;cp`, RTT in ms, failed
    pings recorded as negative values (-3, -4), cp = 1 on the first sample of a new regime."""
    import csv
    for f in sorted(root.glob("*.csv")):
        with f.open() as fh:
            rows = list(csv.DictReader(fh, delimiter=";"))
        xs = [float(r["rtt"]) for r in rows]
        yield f.name, xs, [i for i, r in enumerate(rows) if r["cp"].strip() == "1"]


def f1_at_margin(truth: list[int], pred: list[int], margin: int = MARGIN) -> float:
    """F1 of one trace, each true change matched to at most one prediction within the margin."""
    if not pred or not truth:
        return float(not pred and not truth)
    tp = _true_positives(truth, sorted(set(pred)), margin)
    precision, recall = tp / len(set(pred)), tp / len(truth)
    return 0.0 if tp == 0 else 2 * precision * recall / (precision + recall)


def score_rtt(root: Path, split: str, seed: int) -> dict:
    sums = {name: 0.0 for name in DETECTORS}
    traces = in_split(load_rtt(root), "rtt", split, seed)
    for _, xs, cps in traces:
        for det, fn in DETECTORS.items():
            sums[det] += f1_at_margin(cps, [start for _, start in fn(xs)])
    return {det: f / len(traces) for det, f in sums.items()} | {"_n": len(traces)}


# ---------------------------------------------------------------- main
def _parse_set(ap, items: list[str]) -> dict:
    import ast
    import inspect
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            ap.error(f"--set {item!r}: the value must be a Python literal")
        if not sep or key not in inspect.signature(CUSUM).parameters:
            ap.error(f"--set {item!r}: not KEY=VALUE with KEY a CUSUM parameter")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tcpd", type=Path, default=os.environ.get("TCPD_DIR"))
    ap.add_argument("--nab", type=Path, default=os.environ.get("NAB_DIR"))
    ap.add_argument("--rtt", type=Path, default=os.environ.get("RTT_DIR"),
                    help="WenqinSHAO/rtt's dataset/real_trace_labelled folder")
    ap.add_argument("--split", choices=("dev", "eval"), default="eval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="ablation: a CUSUM keyword argument (Python literal), e.g. min_warmup=None")
    ap.add_argument("--per-file", type=Path, default=None, metavar="PATH",
                    help="write each NAB file's breakdown per detector (JSON) to PATH")
    args = ap.parse_args(argv)
    CUSUM_KWARGS.update(_parse_set(ap, args.set))
    if args.tcpd is None or args.nab is None or args.rtt is None:
        ap.error("--tcpd, --nab and --rtt (or TCPD_DIR / NAB_DIR / RTT_DIR) must point at the "
                 "cloned datasets")
    print(f"split={args.split} seed={args.seed} cusum={CUSUM_KWARGS or 'defaults'} "
          f"loadavg={os.getloadavg()}")
    t = score_tcpd(args.tcpd, args.split, args.seed)
    print(f"TCPD ({t['_n']} series): " + ", ".join(
        f"{d} F1={t[d][0]:.3f} cover={t[d][1]:.3f}" for d in DETECTORS))
    n = score_nab(args.nab, args.split, args.seed)
    print(f"NAB ({n['_n']} files) standard score: " + ", ".join(f"{d}={n[d]:.1f}" for d in DETECTORS))
    if args.per_file is not None:
        args.per_file.write_text(json.dumps(PER_FILE, indent=1))
    r = score_rtt(args.rtt, args.split, args.seed)
    print(f"RTT ({r['_n']} traces) F1 (+/-{MARGIN}): " + ", ".join(f"{d}={r[d]:.3f}" for d in DETECTORS))
    kv, wins = {}, []
    for d in DETECTORS:
        kv[f"tcpd_f1_{d}"] = f"{t[d][0]:.3f}"
        kv[f"tcpd_cover_{d}"] = f"{t[d][1]:.3f}"
        kv[f"nab_{d}"] = f"{n[d]:.1f}"
        kv[f"rtt_f1_{d}"] = f"{r[d]:.3f}"
        if d != "cusum":
            wins += [t["cusum"][0] > t[d][0], t["cusum"][1] > t[d][1], n["cusum"] > n[d],
                     r["cusum"] > r[d]]
    kv["split"] = args.split
    kv["cusum"] = ",".join(f"{k}:{v}" for k, v in CUSUM_KWARGS.items()) or "defaults"
    kv["pass"] = int(all(wins))
    print(" ".join(f"{k}={v}" for k, v in kv.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
