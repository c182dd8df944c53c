"""What a recorded run directory holds: the parquet part files, their schemas, and what is wrong.

Reads only parquet footers (no data). Each ``*.parquet`` file under the directory is classified:

- **usable**: every required column is present with a numeric type; missing optional columns
  (older schema versions) get defaults, extra columns (newer versions) are ignored — both noted;
- **skipped**: the footer cannot be read (a partial or truncated part file), or a required
  column is missing or not numeric — with a message naming the file and the problem.

Temp files (``*.parquet.tmp.<pid>``, a writer that crashed or is still writing) are counted and
ignored. Usable files are grouped by schema so each group is scanned with one polars query.

>>> import tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     inv = take_inventory(d)
>>> inv.files, inv.problems[0]
([], 'no parquet part files (*.parquet) under the directory')
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["PartFile", "Inventory", "take_inventory", "REQUIRED", "OPTIONAL", "STRINGS"]

# numeric columns the report needs; without them a file is skipped
REQUIRED = ("func", "rank", "nranks", "bytes", "timing_source", "gpu_start_ns", "gpu_end_ns",
            "enqueue_ns", "comm_hash", "seq_number")
# numeric columns with a default when absent (older schema versions)
OPTIONAL = {"kind": 1, "algo": 255, "proto": 255, "cpu_end_ns": 0, "tuner_config_version": 0,
            "pid": 0, "n_channels": 0, "nnodes": 0}
STRINGS = ("host", "job_id", "comm_name")
_JOB_DIR = re.compile(r"(?:^|/)job_id=([^/]+)")


@dataclass(frozen=True)
class PartFile:
    path: str
    rows: int
    columns: tuple[str, ...]         # the columns the report will read from it
    missing: tuple[str, ...]         # optional columns absent (defaults used)
    extra: tuple[str, ...]           # columns the report does not know
    casts: tuple[str, ...]           # known columns stored with an unexpected (castable) type
    job_hint: str                    # job_id=<…> partition value of its path, "" if none

    @property
    def schema_key(self) -> tuple:
        return (self.columns, self.casts, self.job_hint if "job_id" not in self.columns else "")


@dataclass
class Inventory:
    directory: str
    files: list[PartFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    temp_files: int = 0
    notes: list[str] = field(default_factory=list)  # usable-but-degraded remarks
    problems: list[str] = field(default_factory=list)  # what made it impossible or partial

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    def groups(self) -> list[list[PartFile]]:
        """Usable files grouped by schema (one polars scan each), in path order."""
        out: dict[tuple, list[PartFile]] = {}
        for f in self.files:
            out.setdefault(f.schema_key, []).append(f)
        return list(out.values())


_NUMERIC = (pa.types.is_integer, pa.types.is_floating)
_EXPECTED = {  # the exporter's types (dynamiccl.collector.wire_format.EVENT_DTYPE)
    "func": pa.uint8(), "rank": pa.int32(), "nranks": pa.int32(), "bytes": pa.uint64(),
    "timing_source": pa.uint8(), "gpu_start_ns": pa.uint64(), "gpu_end_ns": pa.uint64(),
    "enqueue_ns": pa.uint64(), "comm_hash": pa.uint64(), "seq_number": pa.uint64(), "kind": pa.uint8(),
    "algo": pa.uint8(), "proto": pa.uint8(), "cpu_end_ns": pa.uint64(), "tuner_config_version": pa.uint32(),
    "pid": pa.uint32(), "n_channels": pa.uint8(), "nnodes": pa.int32(),
}
_KNOWN_OTHER = {"datatype", "n_warps", "root", "channels_seen", "flags", "count", "record_seq",
                "date", "hour"}


def _is_numeric(t: pa.DataType) -> bool:
    return any(pred(t) for pred in _NUMERIC)


def _is_string(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _classify(path: str) -> PartFile | str:
    try:
        md = pq.read_metadata(path)
        schema = md.schema.to_arrow_schema()
    except Exception as exc:  # truncated, not parquet, unreadable
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"not a complete parquet file ({reason})"
    types = {f.name: f.type for f in schema}
    missing_req = [c for c in REQUIRED if c not in types]
    if missing_req:
        return f"missing required column(s) {', '.join(missing_req)}"
    bad = [c for c in (*REQUIRED, *OPTIONAL) if c in types and not _is_numeric(types[c])]
    bad += [c for c in STRINGS if c in types and not _is_string(types[c])]
    if bad:
        return "column(s) of the wrong type: " + ", ".join(f"{c} ({types[c]})" for c in bad)
    columns = tuple(c for c in (*REQUIRED, *OPTIONAL, *STRINGS) if c in types)
    missing = tuple(c for c in (*OPTIONAL, *STRINGS) if c not in types)
    extra = tuple(sorted(set(types) - set(REQUIRED) - set(OPTIONAL) - set(STRINGS) - _KNOWN_OTHER))
    casts = tuple(c for c in columns if c in _EXPECTED and types[c] != _EXPECTED[c])
    m = _JOB_DIR.search(path.replace(os.sep, "/"))
    return PartFile(path, md.num_rows, columns, missing, extra, casts, m.group(1) if m else "")


def take_inventory(directory: str | os.PathLike) -> Inventory:
    """Classify every parquet part file under ``directory`` (recursively, in path order)."""
    directory = os.fspath(directory)
    inv = Inventory(directory)
    if not os.path.exists(directory):
        raise FileNotFoundError(f"no such directory: {directory}")
    if os.path.isfile(directory):
        paths = [directory]
    else:
        paths = sorted(glob.glob(os.path.join(glob.escape(directory), "**", "*.parquet"), recursive=True))
        inv.temp_files = len(glob.glob(os.path.join(glob.escape(directory), "**", "*.parquet.tmp.*"),
                                       recursive=True))
    for p in paths:
        r = _classify(p)
        if isinstance(r, str):
            inv.skipped.append((p, r))
        elif r.rows == 0:
            continue
        else:
            inv.files.append(r)
    if inv.temp_files:
        inv.notes.append(f"{inv.temp_files} unfinished temp file(s) (*.parquet.tmp.*) ignored: "
                         "a writer was still writing or crashed")
    old = [f for f in inv.files if f.missing]
    if old:
        cols = sorted({c for f in old for c in f.missing})
        inv.notes.append(f"{len(old)} file(s) of an older schema lack {', '.join(cols)}: defaults used "
                         f"({', '.join(f'{c}={OPTIONAL.get(c, chr(34) * 2)}' for c in cols)})")
    new = [f for f in inv.files if f.extra]
    if new:
        cols = sorted({c for f in new for c in f.extra})
        inv.notes.append(f"{len(new)} file(s) of a newer schema have unknown column(s) "
                         f"{', '.join(cols)}: ignored")
    cast = [f for f in inv.files if f.casts]
    if cast:
        cols = sorted({c for f in cast for c in f.casts})
        inv.notes.append(f"{len(cast)} file(s) store {', '.join(cols)} with another numeric type: cast")
    if inv.skipped:
        inv.problems.append(f"{len(inv.skipped)} part file(s) skipped: " + "; ".join(
            f"{os.path.relpath(p, directory) if os.path.isdir(directory) else p}: {why}"
            for p, why in inv.skipped[:5]) + (" …" if len(inv.skipped) > 5 else ""))
    if not paths:
        inv.problems.append("no parquet part files (*.parquet) under the directory")
    elif not inv.files and not inv.skipped:
        inv.problems.append("the part files hold no records")
    return inv
