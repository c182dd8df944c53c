"""Saved profiler records through the plugin's stale-timestamp guard (src/stale_guard.c, via
test/build/libdccl-guard-replay.so from ``make -C dynamiccl/nccl_profiler_plugin emulator``).

Each process's COLL/P2P/PEER records go through one guard in ``record_seq`` order, the order its
sender takes them from the ring, so the result is what the plugin would have sent with the guard.

    python tests/nccl_profiler_plugin/guard_replay.py SRC DST [--tol-us 100]

copies a ``validate-nccl`` output folder SRC to DST with events.npy replayed (run
``python -m dynamiccl.validate --analyse DST`` on it) and prints one line per process.
"""
from __future__ import annotations

import argparse
import ctypes
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "dynamiccl" / "nccl_profiler_plugin" / "test" / "build" / "libdccl-guard-replay.so"
STATES = ("learning", "on", "off")
DEFAULT_TOL_US = 100


@dataclass
class GuardResult:
    pid: int
    records: int
    checked: int
    untimed: int
    state: str
    offset_us: float


def _lib(path: Path = LIB) -> ctypes.CDLL:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run make -C dynamiccl/nccl_profiler_plugin emulator")
    lib = ctypes.CDLL(str(path))
    lib.dccl_guard_replay.restype = ctypes.c_uint64
    lib.dccl_guard_replay.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                                      ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_uint64)]
    return lib


def replay(events: np.ndarray, tol_us: int = DEFAULT_TOL_US) -> tuple[np.ndarray, list[GuardResult]]:
    """A copy of ``events`` (EVENT_DTYPE) as the guard would have sent them, and one result per process."""
    lib = _lib()
    out = events.copy()
    results = []
    for pid in np.unique(out["pid"]).tolist():
        idx = np.flatnonzero(out["pid"] == pid)
        idx = idx[np.argsort(out["record_seq"][idx], kind="stable")]
        part = np.ascontiguousarray(out[idx])
        state, offset, checked = ctypes.c_int(), ctypes.c_int64(), ctypes.c_uint64()
        untimed = lib.dccl_guard_replay(part.ctypes.data, len(part), tol_us, ctypes.byref(state),
                                        ctypes.byref(offset), ctypes.byref(checked))
        out[idx] = part
        results.append(GuardResult(pid, len(part), int(checked.value), int(untimed), STATES[state.value],
                                   offset.value / 1e3))
    return out, results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--tol-us", type=int, default=DEFAULT_TOL_US)
    a = ap.parse_args(argv)
    if a.dst.exists():
        print(f"{a.dst} exists; give a new folder", file=sys.stderr)
        return 2
    shutil.copytree(a.src, a.dst)
    events, results = replay(np.load(a.src / "events.npy"), a.tol_us)
    np.save(a.dst / "events.npy", events)
    for r in results:
        print(f"pid {r.pid}: {r.records} records, guard {r.state} (offset {r.offset_us:+.1f} us), "
              f"{r.untimed} of {r.checked} checked untimed")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
