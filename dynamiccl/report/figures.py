"""Plotly figures of the report. Each collective has one colour everywhere (``FUNC_COLOURS``);
size buckets of a collective are lighter or darker shades of it. Time axes are UTC event time;
sizes, bandwidths and latencies that span decades use log axes with SI tick labels (``100µ`` s,
``10G`` B/s)."""
from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from dynamiccl.detector.events import RegimeChange
from dynamiccl.report.summary import RunSummary, func_name, lat_bin_edges
from dynamiccl.report.tables import heatmap_ranks, latency_hist, mix, rank_labels, size_label, stream_series

__all__ = ["FUNC_COLOURS", "colour", "timeline", "latency_heatmap", "spread_figure", "mix_figure",
           "KIND_COLOURS"]

FUNC_COLOURS = {
    "AllReduce": "#1f77b4", "AllGather": "#ff7f0e", "ReduceScatter": "#2ca02c", "Broadcast": "#d62728",
    "Reduce": "#9467bd", "AlltoAll": "#8c564b", "SendRecv": "#e377c2", "Send": "#7f7f7f", "Recv": "#bcbd22",
    "Gather": "#17becf", "Scatter": "#aec7e8", "PutSignal": "#ffbb78", "Signal": "#98df8a", "WaitSignal": "#ff9896",
}
KIND_COLOURS = {"bandwidth": "#d62728", "latency": "#ff7f0e", "straggler": "#9467bd", "flapping": "#8c564b",
                "recovery": "#2ca02c"}
_FONT = dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12)
MAX_VISIBLE_STREAMS = 8


def colour(func: str, shade: float = 0.0) -> str:
    """The collective's colour; ``shade`` in [-1, 1] mixes toward black (−) or white (+)."""
    h = FUNC_COLOURS.get(func, "#444444").lstrip("#")
    rgb = np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)], float)
    target = 255.0 if shade > 0 else 0.0
    rgb = rgb + (target - rgb) * min(abs(shade), 1.0) * 0.6
    return "#" + "".join(f"{int(round(c)):02x}" for c in rgb)


def _times(t_bins, bin_s: float, centre: bool = True) -> np.ndarray:
    t = (np.asarray(t_bins, np.float64) + (0.5 if centre else 0.0)) * bin_s
    return (t * 1000).astype("datetime64[ms]")


def _dt(t_s: float) -> str:
    return str(np.datetime64(int(round(t_s * 1000)), "ms"))


def _base_layout(fig: go.Figure, title: str, height: int) -> None:
    fig.update_layout(title=dict(text=title, x=0.01), height=height, font=_FONT, template="plotly_white",
                      margin=dict(l=70, r=30, t=60, b=50), hovermode="closest",
                      legend=dict(groupclick="toggleitem"))


def _shades(buckets: list[int]) -> dict[int, float]:
    if len(buckets) == 1:
        return {buckets[0]: 0.0}
    return {b: -0.8 + 1.6 * i / (len(buckets) - 1) for i, b in enumerate(sorted(buckets, reverse=True))}


def _marks(fig: go.Figure, s: RunSummary, changes: list[RegimeChange], truth: list[dict],
           config_times: list[tuple[float, str]], decisions: list[dict]) -> None:
    """Regime changes (onset → detection shaded, detection line), ground truth (grey bands),
    config changes (dotted lines) on every x axis of ``fig``."""
    t_lo, t_hi = s.t_range_s
    for ev in truth:
        a = ev.get("t_start_ns", 0) / 1e9 if "t_start_ns" in ev else ev["t_start"]
        b = ev.get("t_end_ns", 0) / 1e9 if "t_end_ns" in ev else ev["t_end"]
        if b < t_lo or a > t_hi:
            continue
        if b - a < s.bin_s:
            fig.add_vline(x=_dt(a), line=dict(color="#888", width=1, dash="dash"), row="all", col="all")
        else:
            fig.add_vrect(x0=_dt(a), x1=_dt(b), fillcolor="#999", opacity=0.12, line_width=0, layer="below",
                          row="all", col="all")
        fig.add_annotation(x=_dt(a), y=1.0, yref="paper", text=f"true: {ev['kind']}", showarrow=False,
                           xanchor="left", yanchor="bottom", font=dict(size=10, color="#666"))
    for ch in changes:
        c = KIND_COLOURS.get(ch.kind, "#333")
        if ch.detected_s > ch.start_s:
            fig.add_vrect(x0=_dt(ch.start_s), x1=_dt(ch.detected_s), fillcolor=c, opacity=0.15, line_width=0,
                          row="all", col="all")
        fig.add_vline(x=_dt(ch.detected_s), line=dict(color=c, width=1.5), row="all", col="all")
        fig.add_annotation(x=_dt(ch.detected_s), y=1.0, yref="paper", text=ch.kind, showarrow=False, xanchor="left",
                           yanchor="top", font=dict(size=10, color=c), textangle=-90)
    for t, label in config_times:
        fig.add_vline(x=_dt(t), line=dict(color="#000", width=1, dash="dot"), row="all", col="all")
        fig.add_annotation(x=_dt(t), y=0.0, yref="paper", text=label, showarrow=False, xanchor="left",
                           yanchor="bottom", font=dict(size=10))
    for d in decisions:
        if d.get("t") is None or not (t_lo <= d["t"] <= t_hi):
            continue
        col = "#d62728" if d["rollback"] else "#000"
        fig.add_vline(x=_dt(d["t"]), line=dict(color=col, width=1, dash="dashdot"), row="all", col="all")


def timeline(s: RunSummary, changes, truth, config_times, decisions) -> go.Figure:
    """Bus bandwidth and mean latency over time, one line per (collective, size bucket, nranks)."""
    df = stream_series(s).filter(pl.col("n_timed") > 0)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("bus bandwidth", "mean latency"))
    totals = df.group_by("func", "size_bucket", "nranks").agg(pl.col("dur_sum").sum()).sort("dur_sum", descending=True)
    visible = {tuple(r) for r in totals.head(MAX_VISIBLE_STREAMS).select("func", "size_bucket", "nranks").rows()}
    for func in sorted(df["func"].unique().to_list()):
        fname = func_name(func)
        sub = df.filter(pl.col("func") == func)
        shades = _shades(sorted(sub["size_bucket"].unique().to_list()))
        for (sb, nr), g in sorted(sub.group_by("size_bucket", "nranks"), key=lambda kv: kv[0]):
            x = _times(g["t_bin"].to_numpy(), s.bin_s)
            name = f"{fname} {size_label(sb)} · {nr} ranks"
            c = colour(fname, shades[sb])
            vis = True if (func, sb, nr) in visible else "legendonly"
            hover = "%{x}<br>" + name + "<br>%{y:.3s}<extra></extra>"
            fig.add_trace(go.Scatter(x=x, y=g["busbw_Bps"].to_numpy(), mode="lines", name=name, legendgroup=name,
                                     line=dict(color=c, width=1.5), visible=vis,
                                     hovertemplate=hover.replace("%{y:.3s}", "%{y:.3s}B/s")), row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=g["lat_mean_s"].to_numpy(), mode="lines", name=name, legendgroup=name,
                                     line=dict(color=c, width=1.5), visible=vis, showlegend=False,
                                     hovertemplate=hover.replace("%{y:.3s}", "%{y:.3s}s")), row=2, col=1)
    fig.update_yaxes(type="log", exponentformat="SI", title_text="bus bandwidth (B/s)", row=1, col=1)
    fig.update_yaxes(type="log", exponentformat="SI", title_text="mean latency (s)", row=2, col=1)
    fig.update_xaxes(title_text="event time (UTC)", row=2, col=1)
    _marks(fig, s, changes, truth, config_times, decisions)
    _base_layout(fig, f"Bus bandwidth and latency per collective and size ({s.bin_s:g} s bins; "
                      f"top {MAX_VISIBLE_STREAMS} streams by time shown, click the legend for the others)", 720)
    return fig


def latency_heatmap(s: RunSummary, per_decade: int) -> go.Figure:
    """Record counts per (time bin, latency bin); a menu selects the collective."""
    h = latency_hist(s)
    fig = go.Figure()
    if h.height == 0:
        _base_layout(fig, "Latency heatmap: no timed records", 300)
        return fig
    t_all = np.arange(int(h["t_bin"].min()), int(h["t_bin"].max()) + 1)
    lb_all = np.arange(int(h["lat_bin"].min()), int(h["lat_bin"].max()) + 1)
    x = _times(t_all, s.bin_s)
    lo, hi = lat_bin_edges(lb_all, per_decade)
    y = np.sqrt(lo * hi)
    views = [("all collectives", h.group_by("t_bin", "lat_bin").agg(pl.col("n").sum()))]
    for func in sorted(h["func"].unique().to_list()):
        views.append((func_name(func), h.filter(pl.col("func") == func)))
    zmax = 0.0
    grids = []
    for name, v in views:
        z = np.full((len(lb_all), len(t_all)), np.nan, np.float32)
        ti = v["t_bin"].to_numpy() - t_all[0]
        li = v["lat_bin"].to_numpy() - lb_all[0]
        z[li, ti] = np.log10(v["n"].to_numpy().astype(np.float64))
        zmax = max(zmax, float(np.nanmax(z)))
        grids.append((name, z))
    top = max(1, math.ceil(zmax))
    ticks = list(range(0, top + 1))
    for i, (name, z) in enumerate(grids):
        fig.add_trace(go.Heatmap(x=x, y=y, z=z, name=name, visible=i == 0, zmin=0, zmax=top,
                                 colorscale="Viridis", hoverongaps=False,
                                 colorbar=dict(title="records", tickvals=ticks, ticktext=[f"{10 ** t:,}" for t in ticks]),
                                 hovertemplate="%{x}<br>latency ≈ %{y:.3s}s<br>10^%{z:.2f} records<extra>" + name + "</extra>"))
    buttons = [dict(label=name, method="update", args=[{"visible": [j == i for j in range(len(grids))]}])
               for i, (name, _) in enumerate(grids)]
    fig.update_layout(updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.12,
                                        yanchor="top", showactive=True)])
    fig.update_yaxes(type="log", exponentformat="SI", title_text="latency (s)")
    fig.update_xaxes(title_text="event time (UTC)")
    _base_layout(fig, f"Latency heatmap (records per {s.bin_s:g} s bin and latency bin, "
                      f"{per_decade} bins per decade; colour is log-scaled)", 460)
    return fig


def spread_figure(s: RunSummary) -> go.Figure:
    """Cross-rank spread per collective over time, and relative latency per rank (a straggler is
    the red row: its own collectives are short because everyone else waited for it)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.45, 0.55],
                        subplot_titles=("cross-rank spread (max − min duration over the ranks of one instance)",
                                        "relative latency per rank of the largest communicator (own duration / instance median)"))
    if s.spread is not None and s.spread.height:
        sp = (s.spread.filter(pl.col("multi") > 0)
              .with_columns((pl.col("spread_mean_s") * pl.col("multi")).alias("w"))
              .group_by("t_bin", "func").agg(pl.col("w").sum() / pl.col("multi").sum(), pl.col("spread_max_s").max())
              .sort("func", "t_bin"))
        for func in sorted(sp["func"].unique().to_list()):
            g = sp.filter(pl.col("func") == func)
            fname = func_name(func)
            x = _times(g["t_bin"].to_numpy(), s.bin_s)
            fig.add_trace(go.Scatter(x=x, y=g["w"].to_numpy(), mode="lines", name=f"{fname} mean",
                                     line=dict(color=colour(fname), width=1.5), legendgroup=fname,
                                     hovertemplate="%{x}<br>" + fname + " mean spread %{y:.3s}s<extra></extra>"),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=g["spread_max_s"].to_numpy(), mode="lines", name=f"{fname} max",
                                     line=dict(color=colour(fname), width=1, dash="dot"), legendgroup=fname,
                                     hovertemplate="%{x}<br>" + fname + " max spread %{y:.3s}s<extra></extra>"),
                          row=1, col=1)
    keys = heatmap_ranks(s)
    if keys and s.ranks is not None:
        labels = rank_labels(s)
        order = {k: i for i, k in enumerate(keys)}
        p = s.ranks.filter(pl.col("rel_lat").is_not_null())
        t_all = np.arange(int(p["t_bin"].min()), int(p["t_bin"].max()) + 1) if p.height else np.arange(0)
        z = np.full((len(keys), len(t_all)), np.nan, np.float32)
        if p.height:
            ks = zip(p["job_id"].to_list(), p["comm_hash"].to_list(), p["rank"].to_list())
            rows = np.array([order.get(k, -1) for k in ks])
            ok = rows >= 0
            z[rows[ok], (p["t_bin"].to_numpy() - t_all[0])[ok]] = p["rel_lat"].to_numpy()[ok]
        fig.add_trace(go.Heatmap(x=_times(t_all, s.bin_s), y=[labels.get(k, str(k)) for k in keys], z=z,
                                 zmin=0.0, zmax=2.0, colorscale="RdBu", hoverongaps=False,
                                 colorbar=dict(title="relative<br>latency", len=0.5, y=0.27),
                                 hovertemplate="%{x}<br>%{y}<br>relative latency %{z:.2f}<extra></extra>",
                                 showlegend=False), row=2, col=1)
        fig.update_yaxes(autorange="reversed", row=2, col=1, title_text="rank", type="category")
    fig.update_yaxes(type="log", exponentformat="SI", title_text="spread (s)", row=1, col=1)
    fig.update_xaxes(title_text="event time (UTC)", row=2, col=1)
    note = f"; sampled 1 in {s.sample_k} instances" if s.sample_k > 1 else ""
    _base_layout(fig, f"Cross-rank spread and stragglers{note}", 420 + 16 * min(len(keys), 64))
    return fig


def mix_figure(s: RunSummary) -> go.Figure:
    """Bytes and time per collective and size bucket (log y)."""
    m = mix(s)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("bytes (Σ per-rank message bytes)", "time (Σ per-rank durations)"))
    buckets = sorted(m["size_bucket"].unique().to_list())
    cats = [size_label(b) for b in buckets]
    for func in sorted(m["func"].unique().to_list()):
        g = m.filter(pl.col("func") == func)
        fname = func_name(func)
        x = [size_label(b) for b in g["size_bucket"].to_list()]
        fig.add_trace(go.Bar(x=x, y=g["bytes"].cast(pl.Float64).to_numpy(), name=fname, legendgroup=fname,
                             marker_color=colour(fname), hovertemplate=fname + " %{x}: %{y:.3s}B<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(x=x, y=g["time_s"].to_numpy(), name=fname, legendgroup=fname, showlegend=False,
                             marker_color=colour(fname), hovertemplate=fname + " %{x}: %{y:.3s}s<extra></extra>"),
                      row=1, col=2)
    fig.update_layout(barmode="group")
    for c in (1, 2):
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=cats,
                         title_text="message size per rank (log2 bucket, lower edge)", row=1, col=c)
    fig.update_yaxes(type="log", exponentformat="SI", title_text="bytes (B)", row=1, col=1)
    fig.update_yaxes(type="log", exponentformat="SI", title_text="time (rank·s)", row=1, col=2)
    _base_layout(fig, "Collective mix: bytes and time by collective and message size", 430)
    return fig
