"""Namespaces, veth pairs, bridge and tbf: built, shaped, reachable, removed. Needs root + iproute2."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from testbed_helpers import leftovers, require_testbed

from dynamiccl.harness.testbed import netns
from dynamiccl.harness.testbed.netns import Topology, cleanup, list_runs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _need_root():
    require_testbed()


def _qdisc(topo: Topology, i: int) -> tuple[str, str]:
    host = subprocess.run(["tc", "qdisc", "show", "dev", topo.host_links[i]], capture_output=True, text=True).stdout
    ns = subprocess.run(["tc", "-n", topo.namespaces[i], "qdisc", "show", "dev", "eth0"],
                        capture_output=True, text=True).stdout
    return host, ns


def test_topology_lifecycle(tmp_path):
    topo = Topology(2, base_mbit=40, state_dir=tmp_path)
    try:
        topo.create()
        assert topo.state_file.exists()
        assert [r["prefix"] for r in list_runs(tmp_path)] == [topo.prefix]
        host, ns = _qdisc(topo, 1)
        assert "tbf" in host and "rate 40Mbit" in host and "rate 40Mbit" in ns
        topo.set_rate([1], 10)
        host, ns = _qdisc(topo, 1)
        assert "rate 10Mbit" in host and "rate 10Mbit" in ns and topo.rates == [40.0, 10.0]
        # node 0 reaches node 1 over the bridge
        ip1 = topo.node_ip(1)
        server = subprocess.Popen(topo.netns_exec(1, [sys.executable, "-c",
                                  "import socket;s=socket.socket();s.bind(('%s',5999));s.listen();"
                                  "print('up',flush=True);c,_=s.accept();c.sendall(c.recv(5))" % ip1]),
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "up"
        got = subprocess.run(topo.netns_exec(0, [sys.executable, "-c",
                             "import socket;c=socket.create_connection(('%s',5999),timeout=5);"
                             "c.sendall(b'hello');print(c.recv(5).decode())" % ip1]),
                             capture_output=True, text=True, timeout=20).stdout.strip()
        server.wait(10)
        assert got == "hello"
    finally:
        topo.destroy()
    assert leftovers(topo.prefix) == []
    assert not topo.state_file.exists()


def test_cleanup_removes_runs_whose_owner_died(tmp_path):
    code = ("import sys, time; sys.path.insert(0, %r); from dynamiccl.harness.testbed.netns import Topology; "
            "t = Topology(2, state_dir=%r).create(); print(t.prefix, flush=True); time.sleep(60)"
            % (str(ROOT), str(tmp_path)))
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    prefix = owner.stdout.readline().strip()
    assert leftovers(prefix)
    assert cleanup(state_dir=tmp_path) == []  # the owner is alive: left alone
    owner.kill()
    owner.wait()
    time.sleep(0.1)
    removed = cleanup(state_dir=tmp_path)
    assert f"{prefix}-r0" in removed and f"{prefix}br" in removed
    assert leftovers(prefix) == [] and list_runs(tmp_path) == []


def test_a_sweep_with_its_own_state_dir_spares_the_hosts_live_runs(tmp_path, monkeypatch):
    """cleanup(state_dir=X) used to treat every dtb namespace not listed in X as an orphan and
    removed the host's running test beds (a test's sweep killed a recording's ranks)."""
    host_dir = tmp_path / "host"
    monkeypatch.setattr(netns, "STATE_DIR", host_dir)
    topo = Topology(2, base_mbit=40, state_dir=host_dir).create()  # owned by this (live) process
    try:
        cleanup(state_dir=tmp_path / "mine")
        assert leftovers(topo.prefix)
    finally:
        topo.destroy()


def test_cleanup_rejects_a_foreign_prefix():
    with pytest.raises(ValueError, match="dtb"):
        cleanup("eth0")
