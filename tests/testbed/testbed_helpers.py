"""Shared by the test-bed tests (a unique module name: tests/ has no packages)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def require_testbed() -> None:
    """Skip (printing why) unless root, iproute2 and network namespaces are available."""
    from dynamiccl.harness.testbed.netns import TestbedUnavailable, check_available
    try:
        check_available()
    except TestbedUnavailable as exc:
        pytest.skip(f"test bed unavailable: {exc}")


def leftovers(prefix: str) -> list[str]:
    """Namespaces, links and processes that still carry ``prefix``."""
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    procs = subprocess.run(["pgrep", "-af", prefix], capture_output=True, text=True).stdout
    out = [ln.split()[0] for ln in ns.splitlines() if ln.startswith(prefix)]
    out += [ln.split(":")[1].strip() for ln in links.splitlines() if f" {prefix}" in ln]
    out += [ln for ln in procs.splitlines() if "pgrep" not in ln]
    return out


def start_run(state_dir: Path, out_dir: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, DYNAMICCL_TESTBED_STATE=str(state_dir), PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "dynamiccl", "--log-level", "WARNING", "testbed", "run",
                             "--out", str(out_dir), "--quiet", *args],
                            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_state(state_dir: Path, pid: int, timeout: float = 30.0) -> dict:
    """The state file of the run owned by ``pid``, once its namespaces exist."""
    from dynamiccl.harness.testbed.netns import list_runs
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for st in list_runs(state_dir):
            if st.get("pid") == pid:
                ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
                if all(n in ns for n in st["netns"]):
                    return st
        time.sleep(0.1)
    raise AssertionError("the run did not create its namespaces in time")
