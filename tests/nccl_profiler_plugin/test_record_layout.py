"""The generated C header matches dynamiccl.collector.wire_format field by field (offset and size), and
the committed header is exactly what the generator prints."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

from dynamiccl.collector import wire_format as wf

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "dynamiccl" / "nccl_profiler_plugin"
HEADER = PLUGIN_DIR / "include" / "dynamiccl_record.h"
STRUCTS = {
    "dccl_frame_header_t": wf.HEADER_DTYPE,
    "dccl_event_record_t": wf.EVENT_DTYPE,
    "dccl_comm_record_t": wf.COMM_DTYPE,
    "dccl_process_record_t": wf.PROCESS_DTYPE,
    "dccl_stats_record_t": wf.STATS_DTYPE,
}


def test_committed_header_is_generated():
    assert HEADER.read_text() == wf.c_header(), \
        "regenerate: python -m dynamiccl.collector.wire_format > dynamiccl/nccl_profiler_plugin/include/dynamiccl_record.h"


def test_c_layout_matches_numpy(tmp_path):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "dynamiccl_record.h"', "int main(void) {"]
    for name, dt in STRUCTS.items():
        lines.append(f'  printf("{name} sizeof %zu\\n", sizeof({name}));')
        for field in dt.names:
            lines.append(f'  printf("{name} {field} %zu %zu\\n", offsetof({name}, {field}), '
                         f"sizeof((({name}*)0)->{field}));")
    lines += [
        f'  printf("const MAGIC %u\\n", (unsigned)DCCL_WIRE_MAGIC);',
        f'  printf("const RECORD_SIZE %d\\n", DCCL_RECORD_SIZE);',
        f'  printf("const MAX_RECORDS_PER_FRAME %d\\n", DCCL_MAX_RECORDS_PER_FRAME);',
        f'  printf("const UNKNOWN %d\\n", DCCL_UNKNOWN);',
        f'  printf("const FLAG_STALE %d\\n", DCCL_FLAG_STALE);',
        f'  printf("const FLAG_SYMMETRIC %d\\n", DCCL_FLAG_SYMMETRIC);',
        f'  printf("const FLAG_COPY_ENGINE %d\\n", DCCL_FLAG_COPY_ENGINE);',
        f'  printf("const FLAG_TIMING_SUSPECT %d\\n", DCCL_FLAG_TIMING_SUSPECT);',
        "  return 0;", "}",
    ]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(HEADER.parent), str(src), "-o",
                    str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines()
    got: dict[tuple[str, str], tuple[int, ...]] = {}
    for line in out:
        parts = line.split()
        got[(parts[0], parts[1])] = tuple(int(x) for x in parts[2:])
    for name, dt in STRUCTS.items():
        assert got[(name, "sizeof")] == (dt.itemsize,), name
        for field in dt.names:
            sub, off = dt.fields[field][:2]
            assert got[(name, field)] == (off, sub.itemsize), (name, field, got[(name, field)], (off, sub.itemsize))
    assert got[("const", "MAGIC")] == (wf.MAGIC,)
    assert got[("const", "RECORD_SIZE")] == (wf.RECORD_SIZE,)
    assert got[("const", "MAX_RECORDS_PER_FRAME")] == (wf.MAX_RECORDS_PER_FRAME,)
    assert got[("const", "UNKNOWN")] == (wf.UNKNOWN,)
    assert got[("const", "FLAG_STALE")] == (wf.EventFlags.STALE,)
    assert got[("const", "FLAG_SYMMETRIC")] == (wf.EventFlags.SYMMETRIC,)
    assert got[("const", "FLAG_COPY_ENGINE")] == (wf.EventFlags.COPY_ENGINE,)
    assert got[("const", "FLAG_TIMING_SUSPECT")] == (wf.EventFlags.TIMING_SUSPECT,)


def test_enum_tables_in_header_match():
    text = HEADER.read_text()
    for prefix, names in (("func", wf.FUNCS), ("dtype", wf.DATATYPES), ("algo", wf.ALGOS), ("proto", wf.PROTOS)):
        m = re.search(rf"dccl_{prefix}_names\[\] = \{{(.*?)\}};", text)
        assert m and [s.strip().strip('"') for s in m.group(1).split(",")] == list(names)
    m = re.search(r"dccl_dtype_sizes\[\] = \{(.*?)\};", text)
    assert [int(x) for x in m.group(1).split(",")] == list(wf.DATATYPE_SIZES)
    assert np.dtype(wf.EVENT_DTYPE).itemsize == 128
