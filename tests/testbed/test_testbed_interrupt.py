"""A test-bed run removes its namespaces, links and processes when interrupted; a SIGKILLed run is
cleaned up by ``dynamiccl testbed cleanup``. Needs root + iproute2."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from testbed_helpers import ROOT, leftovers, require_testbed, start_run, wait_for_state


@pytest.fixture(autouse=True)
def _need_root():
    require_testbed()


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_signal_during_start_up_cleans_up(tmp_path, sig):
    proc = start_run(tmp_path / "state", tmp_path / "out")
    try:
        st = wait_for_state(tmp_path / "state", proc.pid)
        time.sleep(2.0)  # ranks, sinks and the data server are running inside the namespaces
        assert len(leftovers(st["prefix"])) > len(st["netns"])
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-2000:]
    assert "interrupted by" in out
    assert leftovers(st["prefix"]) == []
    assert not os.path.exists(st["state_file"])


def test_sigkilled_run_is_removed_by_the_cleanup_command(tmp_path):
    state = tmp_path / "state"
    proc = start_run(state, tmp_path / "out")
    try:
        st = wait_for_state(state, proc.pid)
        time.sleep(1.0)
        proc.kill()  # no handler runs: namespaces, links and the ranks stay behind
        proc.wait(10)
        assert leftovers(st["prefix"])
        env = dict(os.environ, DYNAMICCL_TESTBED_STATE=str(state), PYTHONPATH=str(ROOT))
        res = subprocess.run([sys.executable, "-m", "dynamiccl", "testbed", "cleanup"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert f"{st['prefix']}-r0" in res.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run([sys.executable, "-m", "dynamiccl", "testbed", "cleanup", "--prefix", st["prefix"]],
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True)
    deadline = time.monotonic() + 10
    while leftovers(st["prefix"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(st["prefix"]) == []
    assert not os.path.exists(st["state_file"])
