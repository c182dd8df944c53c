"""The demo's live view (rich): the run's state, a history chart per stream, detected changes, retuner targets.

The chart has one column per 1 s window (the newest at the right): the true regime on top (letters), then per
stream a latency and a bus bandwidth sparkline and a marks line: ``▲`` a detected change (at the window it was
detected in), ``◆`` a config switch (the config most of the stream's records ran changed).

>>> sparkline([1.0, 2.0, None, 3.0], lo=1.0, hi=3.0)
'▁▅ █'
>>> regime_letters([{"kind": "bw_drop", "t_start": 1, "t_end": 3, "benign": False}], [0, 1, 2, 3])
'·BB·'
"""
from __future__ import annotations

import math

from dynamiccl.demo.history import History

__all__ = ["LiveView", "sparkline", "regime_letters", "fmt_bytes"]

_BLOCKS = "▁▂▃▄▅▆▇█"
_LETTER = {"bw_drop": "B", "latency": "L", "incast": "I", "straggler": "S", "flap": "F", "degrading_nic": "D",
           "pause": "p", "mix": "m"}


def sparkline(values, lo: float | None = None, hi: float | None = None) -> str:
    """One block character per value scaled to [lo, hi] (default: the values' range); blank for None/NaN."""
    ok = [v for v in values if v is not None and math.isfinite(v)]
    if not ok:
        return " " * len(values)
    lo = min(ok) if lo is None else lo
    hi = max(ok) if hi is None else hi
    span = hi - lo
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(" ")
        else:
            k = 0 if span <= 0 else round((min(max(v, lo), hi) - lo) / span * (len(_BLOCKS) - 1))
            out.append(_BLOCKS[k])
    return "".join(out)


def regime_letters(truth: list[dict], ts) -> str:
    """The true regime per window start in ``ts``: a letter per event kind (``·`` baseline)."""
    out = []
    for t in ts:
        active = [e for e in truth if e["t_start"] <= t < e["t_end"] and e["kind"] != "recovery"]
        out.append(_LETTER.get(active[-1]["kind"], "?") if active else "·")
    return "".join(out)


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} TiB"


def _marks(stream, ts) -> "object":
    from rich.text import Text

    changes = {math.floor(d) for d, _o, _k in stream.changes}
    switches = {math.floor(t) for t, *_ in stream.switches}
    text = Text()
    for t in ts:
        w = math.floor(t)
        if w in changes:
            text.append("▲", style="bold red")
        elif w in switches:
            text.append("◆", style="bold cyan")
        else:
            text.append(" ")
    return text


class LiveView:
    def __init__(self, args, truth, metrics, pipeline, history: History, n_streams: int = 3):
        from rich.console import Console

        self.console = Console()
        self.args, self.truth, self.metrics, self.pipeline = args, truth, metrics, pipeline
        self.history = history
        self.n_streams = n_streams
        self._live = None

    def live(self):
        from rich.live import Live

        self._live = Live(console=self.console, refresh_per_second=4, transient=False)
        return self._live

    def width(self) -> int:
        return max(20, min(96, self.console.width - 52))

    def update(self, wf, state, retuner, pacer=None):
        from rich.console import Group
        from rich.panel import Panel

        epoch_s = state.epoch_s
        now = (wf.window_start - epoch_s) if wf is not None else 0.0
        regime = [e for e in self.truth if e["t_start"] <= now < e["t_end"] and not e.get("benign")]
        version = state.versions[-1][1] if state.versions else 0
        paced = (f"   paced: {pacer.waits} waits, {pacer.timeouts} given up" if pacer is not None and self.args.fast
                 else "")
        header = (f"[b]DynamICCL demo[/b]  t={now:5.0f} s  scenario={self.args.scenario}  "
                  f"workload={self.args.workload}  /metrics: http://{self.metrics}/metrics\n"
                  f"true regime: [yellow]{', '.join(e['kind'] for e in regime) or 'baseline'}[/yellow]   "
                  f"records received={self.pipeline.metrics.received:,}  "
                  f"dropped={sum(self.pipeline.metrics.dropped.values()):,}   "
                  f"tuner config version={version}{' (dry run)' if self.args.dry_run else ''}{paced}")
        self._live.update(Group(Panel(header), self.chart(now), self.changes(state), self.targets(retuner)))

    def chart(self, now: float):
        from rich.table import Table
        from rich.text import Text

        w = self.width()
        ts = [now - w + 1 + i for i in range(w)]
        table = Table(title=f"history, last {w} s (one column per window; ▲ change detected, ◆ config switch; "
                            "regime: B bandwidth drop, L latency, S straggler, p pause)", expand=False)
        table.add_column("stream", no_wrap=True, min_width=20)
        table.add_column("", no_wrap=True, min_width=5)
        table.add_column("chart", no_wrap=True, min_width=w)
        table.add_column("now", justify="right", no_wrap=True, min_width=10)
        table.add_row("true regime", "", Text(regime_letters(self.truth, ts), style="yellow"), "")
        for (fam, func, bucket), s in self.history.top(self.n_streams):
            by_t = {math.floor(t): i for i, t in enumerate(s.t)}
            idx = [by_t.get(math.floor(t)) for t in ts]
            lat = [None if i is None else s.lat_s[i] for i in idx]
            bw = [None if i is None else s.busbw[i] for i in idx]
            name = f"{fam} {func} {fmt_bytes(2 ** bucket)}"
            cur_lat = next((v for v in reversed(lat) if v is not None), None)
            cur_bw = next((v for v in reversed(bw) if v is not None), None)
            cfg = f"{s.cfg[-1]} v{s.version[-1]}" if s.cfg else ""
            table.add_row(name, "lat", Text(sparkline(lat, lo=0.0), style="yellow"),
                          f"{cur_lat * 1e3:.3f} ms" if cur_lat is not None else "-")
            table.add_row(cfg, "busbw", Text(sparkline(bw, lo=0.0), style="green"),
                          f"{cur_bw / 1e9:.1f} GB/s" if cur_bw is not None else "-")
            table.add_row("", "marks", _marks(s, ts), "")
        return table

    @staticmethod
    def changes(state):
        from dynamiccl.demo.summary import where

        return _table("detected regime changes", ("detected (s)", "onset (s)", "kind", "magnitude", "where"),
                      [(f"{c.detected_s - state.epoch_s:.0f}", f"{c.start_s - state.epoch_s:.0f}", c.kind,
                        f"{c.magnitude:.2f}x", where(c)) for c in state.changes[-5:]])

    @staticmethod
    def targets(retuner):
        return _table("retuner targets", ("target", "running", "baseline", "regime", "exploring"),
                      [(st["target"], str(st["running"]), str(st["baseline"]), str(st["regime"]),
                        str(st["exploring"] or "")) for st in retuner.status()[:4]])


def _table(title: str, columns, rows):
    from rich.table import Table

    table = Table(title=title, expand=True)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    return table
