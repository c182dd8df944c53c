"""SIGTERM ends the collector within 5 s even when its parquet writer is wedged."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


@pytest.mark.slow
def test_sigterm_ends_the_collector_within_5s_with_a_wedged_writer():
    d = tempfile.mkdtemp(prefix="dccl")
    proc = subprocess.Popen([sys.executable, "-m", "dynamiccl", "collector", "--listen", f"unix:{d}/c.sock",
                             "--metrics", "off", "--features", "off", "--parquet", f"{d}/pq",
                             "--gpu-telemetry", "off"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        assert "collector ready" in proc.stdout.readline()
        writer = _children(proc.pid)[0]
        os.kill(writer, signal.SIGSTOP)        # a writer that no longer makes progress
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - t0
        assert took < 5.0, f"collector took {took:.1f} s to stop"  # before: ~30 s (writer_timeout_s)
    finally:
        if writer is not None:
            try:
                os.kill(writer, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
