"""Assemble the report: one self-contained HTML file (plotly.js inline, no network needed).

Tables are plain HTML; every numeric cell carries its exact value in ``data-v`` (the text is
the rounded, unit-formatted rendering) so tests and scripts can read the numbers back.
"""
from __future__ import annotations

import datetime as _dt
import html
import os
from typing import Any, Iterable

import plotly.io as pio

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.report.figures import KIND_COLOURS, latency_heatmap, mix_figure, spread_figure, timeline
from dynamiccl.report.sidecars import MARKED_ACTIONS, Sidecars, decision_rows
from dynamiccl.report.summary import RunSummary, func_name
from dynamiccl.report.tables import (change_rows, config_changes, fmt_bytes, fmt_seconds, mix, overview, size_label,
                           stragglers, truth_rows)

__all__ = ["render", "write_report"]

MAX_DECISION_ROWS = 1000
MAX_MARKS = 200  # regime changes / decisions / truth events drawn on the timeline

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0 auto;max-width:1400px;padding:16px 24px;color:#222}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table.data{border-collapse:collapse;font-size:13px;margin:6px 0 12px}
table.data th,table.data td{border:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}
table.data th{background:#f4f4f4}table.data td.l,table.data th.l{text-align:left;white-space:normal}
.note{color:#555;font-size:13px}.problem{color:#a00;font-size:13px}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.kv td{border:none;padding:1px 12px 1px 0;font-size:13px}.muted{color:#888}
"""


def _utc(t_s: float | None) -> str:
    if t_s is None:
        return "-"
    return _dt.datetime.fromtimestamp(t_s, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _rel(t_s: float | None, t0: float) -> str:
    return "-" if t_s is None else f"+{t_s - t0:,.1f} s"


def _cell(text: Any, value: Any = None, left: bool = False, style: str = "") -> str:
    cls = ' class="l"' if left else ""
    dv = "" if value is None else f' data-v="{html.escape(repr(value) if isinstance(value, float) else str(value))}"'
    st = f' style="{style}"' if style else ""
    return f"<td{cls}{dv}{st}>{html.escape(str(text))}</td>"


def _table(tid: str, headers: Iterable[str], rows: Iterable[str], left_cols: int = 1) -> str:
    hs = "".join(f'<th{" class=l" if i < left_cols else ""}>{html.escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join(f"<tr>{r}</tr>" for r in rows)
    return f'<table class="data" id="{tid}"><thead><tr>{hs}</tr></thead><tbody>{body}</tbody></table>'


def _fig(fig, div_id: str) -> str:
    return pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True, "toImageButtonOptions": {"format": "png"}})


def _swatch(func: str) -> str:
    from dynamiccl.report.figures import colour
    return f'<span class="swatch" style="background:{colour(func)}"></span>'


def render(s: RunSummary, side: Sidecars, *, title: str | None = None, per_decade: int = 10) -> str:
    """The report page as a string: the overview, then one section per function below."""
    from plotly.offline import get_plotlyjs

    title = title or f"DynamICCL report: {s.directory}"
    ov = None if s.empty else overview(s)
    parts = _overview(s, side, title, ov)
    if ov is None:
        return _page(title, "\n".join(parts), get_plotlyjs())
    t0 = ov["start_s"]
    decisions = decision_rows(side.decisions)
    versions, switches = config_changes(s)
    parts += _figures(s, side, decisions, versions, per_decade)
    parts += _stragglers(s, t0)
    parts += _changes(side, t0)
    parts += _retuner(decisions, versions, switches, t0)
    parts += _mix(s)
    return _page(title, "\n".join(parts), get_plotlyjs())


def _overview(s: RunSummary, side: Sidecars, title: str, ov: dict | None) -> list[str]:
    esc = html.escape
    parts = [f"<h1>{esc(title)}</h1>"]
    problems = [*s.problems, *side.problems]
    if ov is None:
        parts.append('<p class="problem">No records could be read: ' + esc("; ".join(problems) or "empty run") + "</p>")
    else:
        kv = [("records", f"{ov['records']:,} ({ov['timed']:,} timed)"),
              ("event time", f"{_utc(ov['start_s'])} → {_utc(ov['end_s'])} UTC ({fmt_seconds(ov['end_s'] - ov['start_s'])})"),
              ("jobs", ", ".join(ov["jobs"]) or "-"), ("communicators", f"{ov['communicators']}"),
              ("processes / hosts", f"{ov['processes']} / {ov['hosts']}"),
              ("part files", f"{ov['files']} read, {ov['skipped_files']} skipped"),
              ("time bin", f"{ov['bin_s']:g} s"),
              ("regime changes", f"{len(side.changes)} ({side.paths.get('changes', 'no changes.jsonl found')})"),
              ("retuner decisions", f"{len(side.decisions)} ({side.paths.get('decisions', 'no retuner-audit.jsonl found')})"),
              ("ground truth", side.paths.get("truth", "none"))]
        parts.append('<table class="kv" id="overview">' + "".join(
            f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in kv) + "</table>")
    for p in problems:
        parts.append(f'<p class="problem">⚠ {esc(p)}</p>')
    for n in s.notes:
        parts.append(f'<p class="note">ℹ {esc(n)}</p>')
    return parts


def _figures(s: RunSummary, side: Sidecars, decisions: list, versions: list, per_decade: int) -> list[str]:
    parts: list[str] = []
    config_times = [(v["first_s"], f"config v{v['version']}") for v in versions[1:]]
    parts.append("<h2>Bandwidth and latency over time</h2>")
    parts.append('<p class="note">Shaded grey: ground-truth regimes; coloured lines: detected regime changes '
                 '(shaded from the estimated onset to the detection); dotted: tuner config versions seen in the '
                 'records; dash-dot: retuner decisions (red: rollbacks). Colours: ' + " ".join(
                     f'<span style="color:{c}">{k}</span>' for k, c in KIND_COLOURS.items()) + ".</p>")
    marked = [d for d in decisions if d["action"] in MARKED_ACTIONS][:MAX_MARKS]
    changes = sorted(side.changes, key=lambda c: c.detected_s)[:MAX_MARKS]
    if len(side.changes) > MAX_MARKS or len(decisions) > len(marked) and len(marked) == MAX_MARKS:
        parts.append(f'<p class="note">Only the first {MAX_MARKS} regime changes and retuner decisions are marked '
                     'on the plot; the tables list them all.</p>')
    parts.append(_fig(timeline(s, changes, side.truth[:MAX_MARKS], config_times[:MAX_MARKS], marked), "fig-timeline"))
    parts.append("<h2>Latency heatmap</h2>")
    parts.append(_fig(latency_heatmap(s, per_decade), "fig-heatmap"))
    parts.append("<h2>Cross-rank spread and straggler ranks</h2>")
    parts.append(_fig(spread_figure(s), "fig-spread"))
    return parts


def _stragglers(s: RunSummary, t0: float) -> list[str]:
    parts: list[str] = []
    st = stragglers(s)
    if st:
        parts.append('<p class="note">Straggler intervals: time bins in which a rank\'s relative latency (own '
                     'duration / instance median, over at least 5 instances) was the lowest of its communicator '
                     'and below 0.5 × the communicator\'s median rank. A late GPU shows in every communicator it '
                     'belongs to; in 2-rank communicators only large delays qualify.</p>')
        parts.append(_table("stragglers", ["communicator rank (host:pid)", "from (UTC)", "to", "duration",
                                           "relative latency", "arrival lag"],
                            (_cell(r["rank_label"], left=True) + _cell(_utc(r["from_s"]), r["from_s"])
                             + _cell(_rel(r["to_s"], t0), r["to_s"]) + _cell(fmt_seconds(r["to_s"] - r["from_s"]))
                             + _cell(f"{r['rel_lat']:.2f}", r["rel_lat"])
                             + _cell(fmt_seconds(r["arrival_lag_s"]), r["arrival_lag_s"]) for r in st)))
    else:
        parts.append('<p class="note">No straggler: in no time bin was a rank\'s relative latency (over at '
                     'least 5 instances) below 0.5 × its communicator\'s median rank.</p>')
    return parts


def _changes(side: Sidecars, t0: float) -> list[str]:
    esc = html.escape
    parts: list[str] = []
    parts.append("<h2>Regime changes</h2>")
    if side.changes:
        rows = change_rows(side.changes, side.truth)
        parts.append(_table("changes", ["id", "kind", "onset (UTC)", "detected", "detection delay", "magnitude",
                                        "where", "ground truth", "delay from true onset"],
                            (_cell(r["id"], left=True)
                             + _cell(r["kind"], r["kind"], style=f"color:{KIND_COLOURS.get(r['kind'], '#000')}")
                             + _cell(_utc(r["start_s"]) + f" ({_rel(r['start_s'], t0)})", r["start_s"])
                             + _cell(_rel(r["detected_s"], t0), r["detected_s"])
                             + _cell(fmt_seconds(r["delay_s"]), r["delay_s"])
                             + _cell(f"{r['magnitude']:.3g}×", r["magnitude"])
                             + _cell(r["where"] + (f"; ends {r['recovers']}" if r["recovers"] else ""), left=True)
                             + _cell(r["truth"] or "-", left=True)
                             + _cell(fmt_seconds(r["truth_delay_s"]), r["truth_delay_s"]) for r in rows), left_cols=1))
    else:
        parts.append(f'<p class="note">No regime changes recorded (no {esc("changes.jsonl")} next to the parquet '
                     'directory). <code>dynamiccl replay DIR</code> runs the detector over this run.</p>')
    if side.truth:
        parts.append("<h3>Ground truth</h3>")
        parts.append(_table("truth", ["event", "from", "to", "where", "first detection", "delay"],
                            (_cell(r["kind"] + (" (benign)" if r["benign"] else ""), left=True)
                             + _cell(_rel(r["start_s"], t0), r["start_s"]) + _cell(_rel(r["end_s"], t0), r["end_s"])
                             + _cell(r["where"], left=True) + _cell(r["change"] or "not detected", left=True)
                             + _cell(fmt_seconds(r["delay_s"]), r["delay_s"]) for r in truth_rows(side.truth, side.changes))))
    return parts


def _retuner(decisions: list, versions: list, switches: list, t0: float) -> list[str]:
    esc = html.escape
    parts: list[str] = []
    parts.append("<h2>Retuner decisions and config changes</h2>")
    if decisions:
        from collections import Counter
        counts = Counter(d["action"] for d in decisions)
        shown = decisions[:MAX_DECISION_ROWS]
        parts.append(f'<p class="note">{len(decisions)} decisions ('
                     + esc(", ".join(f"{a} {n}" for a, n in sorted(counts.items()))) + f"), {counts.get('rollback', 0)} "
                     f"rollback(s){'; dry run' if all(d['dry_run'] for d in decisions) else ''}"
                     + (f"; the first {MAX_DECISION_ROWS} are listed" if len(decisions) > MAX_DECISION_ROWS else "")
                     + ".</p>")
        parts.append(_table("decisions", ["time", "action", "target", "config", "version", "gain",
                                          "rollback", "dry run", "reason", "details"],
                            (_cell(_rel(d["t"], t0), d["t"]) + _cell(d["action"], d["action"], left=True)
                             + _cell(d["target"], left=True) + _cell(d["config"], left=True)
                             + _cell("-" if d["version"] is None else d["version"], d["version"])
                             + _cell("-" if d["gain"] is None else f"{d['gain']:.3g}×" + (" expected" if d["gain_expected"] else ""),
                                     d["gain"])
                             + _cell("yes" if d["rollback"] else "", int(d["rollback"]))
                             + _cell("yes" if d["dry_run"] else "", int(d["dry_run"]))
                             + _cell(d["reason"], left=True) + _cell(d["details"], left=True) for d in shown),
                            left_cols=0))
    else:
        parts.append('<p class="note">No retuner audit log (retuner-audit.jsonl) next to the parquet directory. '
                     '<code>dynamiccl replay DIR --audit-out RUN/retuner-audit.jsonl</code> runs the retuner in '
                     'dry run over this run.</p>')
    parts.append(_table("versions", ["tuner config version", "first seen", "last seen", "records"],
                        (_cell(v["version"], v["version"]) + _cell(_rel(v["first_s"], t0), v["first_s"])
                         + _cell(_rel(v["last_s"], t0), v["last_s"]) + _cell(f"{v['records']:,}", v["records"])
                         for v in versions), left_cols=0))
    if switches:
        parts.append('<p class="note">Algorithm/protocol switches of a stream (the dominant configuration of a '
                     '(collective, size, nranks) stream changed between consecutive bins):</p>')
        parts.append(_table("switches", ["time", "collective", "size", "nranks", "from", "to"],
                            (_cell(_rel(w["t_s"], t0), w["t_s"]) + _cell(w["func"], left=True)
                             + _cell(size_label(w["size_bucket"]), w["size_bucket"]) + _cell(w["nranks"], w["nranks"])
                             + _cell(w["from"], left=True) + _cell(w["to"], left=True) for w in switches), left_cols=0))
    return parts


def _mix(s: RunSummary) -> list[str]:
    parts: list[str] = []
    parts.append("<h2>Collective mix</h2>")
    parts.append(_fig(mix_figure(s), "fig-mix"))
    m = mix(s)
    parts.append(_table("mix", ["collective", "size bucket", "records", "timed", "bytes", "time (rank·s)",
                                "time share", "mean latency", "bus bandwidth"],
                        (_cell(func_name(r["func"]), func_name(r["func"]), left=True)
                         + _cell(size_label(r["size_bucket"]), r["size_bucket"])
                         + _cell(f"{r['records']:,}", r["records"]) + _cell(f"{r['n_timed']:,}", r["n_timed"])
                         + _cell(fmt_bytes(float(r["bytes"])), r["bytes"]) + _cell(fmt_seconds(r["time_s"]), r["time_s"])
                         + _cell("-" if r["time_share"] is None else f"{100 * r['time_share']:.1f} %", r["time_share"])
                         + _cell(fmt_seconds(r["lat_mean_s"]), r["lat_mean_s"])
                         + _cell("-" if r["busbw_Bps"] is None else f"{r['busbw_Bps'] / 1e9:.3g} GB/s", r["busbw_Bps"])
                         for r in m.iter_rows(named=True))))
    parts.append('<p class="note muted">Latency = GPU kernel end − start (KernelCh, or host clock when only that '
                 'is known); bus bandwidth = Σ(bytes × nccl-tests bus factor) / Σ latency over timed records. '
                 'Generated by <code>dynamiccl report</code>.</p>')
    return parts


def _page(title: str, body: str, plotly_js: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
            f"<script type=\"text/javascript\">{plotly_js}</script></head>\n<body>\n{body}\n</body></html>\n")


def write_report(s: RunSummary, side: Sidecars, out: str | os.PathLike, **kw) -> str:
    """Write atomically (tmp + rename); returns the path."""
    out = os.fspath(out)
    text = render(s, side, **kw)
    d = os.path.dirname(os.path.abspath(out))
    os.makedirs(d, exist_ok=True)
    atomic_write(out, text)
    return out
