"""Shared helpers of the report tests: a small synthetic run, the HTML tables read back, and the
raw records read independently of the report's polars path (pyarrow → numpy → dynamiccl.collector.records)."""
from __future__ import annotations

import glob
import html.parser
import os

import numpy as np
import pyarrow.parquet as pq

from dynamiccl.collector.wire_format import EVENT_DTYPE


def make_run(root, *, records: int = 60_000, seed: int = 3, rate_per_s: float = 500.0,
             chunk_records: int = 20_000, flush_rows: int = 20_000) -> str:
    """A synthetic run (dynamiccl.harness.synthetic_run) under ``root``/parquet; returns the parquet directory."""
    from dynamiccl.harness.synthetic_run import write_run
    d = os.path.join(str(root), "parquet")
    write_run(d, records=records, seed=seed, rate_per_s=rate_per_s, chunk_records=chunk_records,
              flush_rows=flush_rows)
    return d


def part_files(d: str) -> list[str]:
    return sorted(glob.glob(os.path.join(d, "**", "*.parquet"), recursive=True))


def raw_events(paths) -> np.ndarray:
    """All rows of ``paths`` as an EVENT_DTYPE array (fields absent from a file stay 0)."""
    parts = []
    for p in paths:
        t = pq.read_table(p)
        ev = np.zeros(t.num_rows, EVENT_DTYPE)
        for f in EVENT_DTYPE.names:
            if f in t.column_names:
                ev[f] = t.column(f).to_numpy()
        parts.append(ev)
    return np.concatenate(parts) if parts else np.zeros(0, EVENT_DTYPE)


class _Tables(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[tuple[str, str | None]]]] = {}
        self.headers: dict[str, list[str]] = {}
        self._id = None
        self._row = None
        self._cell = None
        self._in_th = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "id" in a:
            self._id = a["id"]
            self.tables[self._id] = []
            self.headers[self._id] = []
        elif self._id and tag == "tr":
            self._row = []
        elif self._id and tag in ("td", "th"):
            self._cell = ["", a.get("data-v")]
            self._in_th = tag == "th"

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[0] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            if self._in_th:
                self.headers[self._id].append(self._cell[0])
            else:
                self._row.append((self._cell[0], self._cell[1]))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[self._id].append(self._row)
            self._row = None
        elif tag == "table":
            self._id = None


def read_tables(text: str) -> dict[str, list[dict[str, tuple[str, str | None]]]]:
    """{table id: [ {header: (text, data-v)} per row ]} for every ``<table id=…>`` of the page."""
    p = _Tables()
    p.feed(text)
    return {tid: [dict(zip(p.headers[tid], row)) for row in rows] for tid, rows in p.tables.items()}


def num(cell) -> float | None:
    v = cell[1]
    return None if v in (None, "None") else float(v)
