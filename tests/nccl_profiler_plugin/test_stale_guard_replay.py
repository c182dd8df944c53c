"""The stale-timestamp guard (src/stale_guard.c) on real records: rank 0 of the H200 validate-nccl run
(NCCL 2.28.9, 4 ranks on one GPU, 2026-11-27), every record of its main launch as the plugin sent them
(without this guard), in ring order. After the first all-to-all NCCL's KernelCh events carry older
kernels' pTimers; 34 such records kept their channel's order and a short span, so the order guard and
the span check passed them: their GPU start precedes their own enqueue by up to 60 ms."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from guard_replay import replay  # noqa: E402

from dynamiccl.collector.wire_format import EventFlags, TimingSource  # noqa: E402

DATA = Path(__file__).with_name("data") / "h200_nccl2289_rank0_records.npz"


def _load() -> tuple[np.ndarray, int]:
    z = np.load(DATA)
    return z["events"], int(z["alltoall_start_ns"])


def _gpu_timed(ev: np.ndarray) -> np.ndarray:
    return ev["timing_source"] == TimingSource.KERNEL_GPU


def _starts_before_enqueue(ev: np.ndarray) -> np.ndarray:
    """GPU-timed and the GPU start before the enqueue: impossible on this host, whose GPU clock runs
    20-60 us ahead of CLOCK_REALTIME (every record before the all-to-all starts >= 36 us after it)."""
    return _gpu_timed(ev) & (ev["gpu_start_ns"].astype(np.int64) < ev["enqueue_ns"].astype(np.int64))


def test_recorded_run_has_unflagged_stale_records():
    ev, a2a = _load()
    before = ev["enqueue_ns"] < a2a
    assert not np.any(_starts_before_enqueue(ev[before]))
    assert int(np.sum(_starts_before_enqueue(ev[~before]))) == 34


def test_guard_untimes_the_stale_records_and_nothing_before_the_alltoall(built):
    ev, a2a = _load()
    out, results = replay(ev)
    (res,) = results
    assert res.state == "on" and -60 < res.offset_us < -10, res
    before = ev["enqueue_ns"] < a2a
    newly = ((out["flags"] & EventFlags.TIMING_SUSPECT) != 0) & ((ev["flags"] & EventFlags.TIMING_SUSPECT) == 0)
    assert not np.any(newly[before]), "a healthy record before the all-to-all was untimed"
    assert not np.any(_starts_before_enqueue(out)), "a stale record is still GPU-timed"
    assert res.untimed == int(np.sum(newly)) == 34
    assert np.all(out["timing_source"][newly] == TimingSource.NONE)
    assert np.array_equal(out["gpu_start_ns"], ev["gpu_start_ns"]) and np.array_equal(out["gpu_end_ns"], ev["gpu_end_ns"])
    assert int(np.sum(_gpu_timed(out[before]))) == int(np.sum(_gpu_timed(ev[before])))


def test_guard_off_leaves_every_record(built):
    ev, _ = _load()
    out, (res,) = replay(ev, tol_us=0)
    assert res.state == "off" and res.untimed == 0 and np.array_equal(out, ev)


def test_guard_stays_off_on_simulated_ptimers(built):
    """The same records with the pTimers moved by a day (an emulator's simulated clock): never aligned."""
    ev, _ = _load()
    moved = ev.copy()
    timed = moved["gpu_start_ns"] > 0
    moved["gpu_start_ns"][timed] -= np.uint64(86_400 * 10**9)
    moved["gpu_end_ns"][timed] -= np.uint64(86_400 * 10**9)
    out, (res,) = replay(moved)
    assert res.state == "off" and res.untimed == 0 and np.array_equal(out, moved)
