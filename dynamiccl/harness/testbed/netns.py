"""Network namespaces joined by veth pairs and a bridge, with ``tc tbf`` on every link.

One run owns a unique prefix ``dtb`` + 4 hex digits (``dtb3f9a``) and everything it creates
carries it: the bridge ``dtb3f9abr``, per node a namespace ``dtb3f9a-r0`` holding ``eth0`` (the
namespace end of a veth pair) and the root-namespace end ``dtb3f9ah0`` enslaved to the bridge.
A link's capacity is shaped in both directions — ``tbf`` on ``eth0`` inside the namespace (the
node's uplink) and on ``dtb3f9ah0`` (its downlink) — so throttling a node's link throttles
everything it sends and receives.

Before creating anything the run writes a state file ``<state_dir>/<prefix>.json`` (owner pid,
namespaces, links; atomic write), so :func:`cleanup` can always find what to remove: a run's own
teardown, its signal/atexit handlers, and ``dynamiccl testbed cleanup`` (which removes runs whose
owner is dead, and any ``dtbXXXX`` namespace or link no live run owns) all go through it.

>>> t = Topology(3, prefix="dtb00aa", base_mbit=100, dry_run=True)
>>> t.node_ip(1), t.namespaces[1], t.host_links[1]
('10.223.170.11', 'dtb00aa-r1', 'dtb00aah1')
>>> t.tbf_args(40)
['tbf', 'rate', '40000kbit', 'burst', '65536', 'latency', '200ms']
"""
from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from dynamiccl.contracts.atomic import atomic_write

__all__ = ["Topology", "TestbedUnavailable", "check_available", "cleanup", "list_runs",
           "new_prefix", "STATE_DIR", "PREFIX_RE"]

log = logging.getLogger(__name__)

# dtb: runs and tests; dtc: corpus recordings, out of reach of older sweeps that took every dtb
# name they did not own for an orphan
PREFIX_RE = re.compile(r"dt[bc][0-9a-f]{4}")
STATE_DIR = Path(os.environ.get("DYNAMICCL_TESTBED_STATE", "/run/dynamiccl-testbed"))


class TestbedUnavailable(RuntimeError):
    """The test bed cannot run here (not root, no iproute2, no namespace support)."""

    __test__ = False  # not a pytest test class


DIRECTIONS = ("both", "ingress", "egress")


def check_available() -> None:
    """Raise :class:`TestbedUnavailable` naming what is missing."""
    if os.geteuid() != 0:
        raise TestbedUnavailable("the test bed needs root (network namespaces, veth, tc)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedUnavailable(f"the test bed needs iproute2: `{tool}` not found on PATH")
    probe = new_prefix() + "-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        raise TestbedUnavailable(f"cannot create a network namespace: {r.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def new_prefix(family: str = "dtb") -> str:
    if family not in ("dtb", "dtc"):
        raise ValueError(f"prefix family must be dtb or dtc, got {family!r}")
    return family + secrets.token_hex(2)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    return True


def _write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1), fsync=False)


@dataclass
class _Cmd:
    args: list[str]
    check: bool = True


class Topology:
    """``nodes`` namespaces on one bridge; node ``i`` has address ``node_ip(i)``.

    ``create()`` builds it (state file first), ``set_rate(nodes, mbit)`` re-shapes links,
    ``destroy()`` removes everything (idempotent). ``dry_run`` only records the commands.
    """

    def __init__(self, nodes: int, *, prefix: str | None = None, base_mbit: float = 200.0,
                 burst_bytes: int = 65536, latency_ms: int = 200, mtu: int = 9000,
                 state_dir: Path | None = None, dry_run: bool = False):
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        self.prefix = prefix or new_prefix()
        if not PREFIX_RE.fullmatch(self.prefix):
            raise ValueError(f"prefix must look like dtb (or dtc) + 4 hex digits, got {self.prefix!r}")
        self.nodes = nodes
        self.base_mbit = float(base_mbit)
        self.burst_bytes = int(burst_bytes)
        self.latency_ms = int(latency_ms)
        self.mtu = int(mtu)  # jumbo frames: 6x fewer packets through the (shared) softirq path
        self.state_dir = Path(state_dir or STATE_DIR)
        self.dry_run = dry_run
        self.commands: list[list[str]] = []
        p = self.prefix
        self.bridge = f"{p}br"
        self.namespaces = [f"{p}-r{i}" for i in range(nodes)]
        self.host_links = [f"{p}h{i}" for i in range(nodes)]
        self._ns_links = [f"{p}n{i}" for i in range(nodes)]
        octet = int(p[3:], 16)
        self.subnet = f"10.223.{octet % 256}"
        self.rates = [self.base_mbit] * nodes
        self.dir_rates = [{"ingress": self.base_mbit, "egress": self.base_mbit} for _ in range(nodes)]
        self.created = False

    # -- naming -------------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.state_dir / f"{self.prefix}.json"

    def node_ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def tbf_args(self, mbit: float) -> list[str]:
        kbit = max(8, int(round(mbit * 1000)))
        return ["tbf", "rate", f"{kbit}kbit", "burst", str(self.burst_bytes),
                "latency", f"{self.latency_ms}ms"]

    def netns_exec(self, i: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[i], *argv]

    # -- commands -------------------------------------------------------------------------------
    def _run(self, args: list[str], check: bool = True) -> subprocess.CompletedProcess | None:
        self.commands.append(args)
        if self.dry_run:
            return None
        r = subprocess.run(args, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"`{' '.join(args)}` failed: {r.stderr.strip()}")
        return r

    def _state(self) -> dict:
        return {"prefix": self.prefix, "pid": os.getpid(), "created_s": time.time(),
                "netns": self.namespaces, "links": [self.bridge, *self.host_links]}

    def create(self) -> "Topology":
        if not self.dry_run:
            _write_atomic(self.state_file, self._state())
        try:
            self._run(["ip", "link", "add", self.bridge, "mtu", str(self.mtu), "type", "bridge"])
            self._run(["ip", "link", "set", self.bridge, "up"])
            for i in range(self.nodes):
                ns, h, n = self.namespaces[i], self.host_links[i], self._ns_links[i]
                self._run(["ip", "netns", "add", ns])
                self._run(["ip", "link", "add", h, "mtu", str(self.mtu), "type", "veth", "peer", "name", n,
                           "mtu", str(self.mtu)])
                self._run(["ip", "link", "set", n, "netns", ns])
                self._run(["ip", "link", "set", h, "master", self.bridge])
                self._run(["ip", "link", "set", h, "up"])
                self._run(["ip", "-n", ns, "link", "set", n, "name", "eth0"])
                self._run(["ip", "-n", ns, "addr", "add", f"{self.node_ip(i)}/24", "dev", "eth0"])
                self._run(["ip", "-n", ns, "link", "set", "eth0", "up"])
                self._run(["ip", "-n", ns, "link", "set", "lo", "up"])
                self._run(["tc", "qdisc", "add", "dev", h, "root", *self.tbf_args(self.base_mbit)])
                self._run(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *self.tbf_args(self.base_mbit)])
        except BaseException:
            self.destroy()
            raise
        self.created = True
        return self

    def set_rate(self, nodes, mbit: float, direction: str = "both") -> None:
        """Re-shape the links of ``nodes`` (iterable of indices) to ``mbit``: ``ingress`` shapes what
        the node receives (the bridge side of its veth), ``egress`` what it sends (its eth0),
        ``both`` both. ``rates`` keeps the lower of the two directions."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
        for i in nodes:
            if direction in ("both", "ingress"):
                self._run(["tc", "qdisc", "change", "dev", self.host_links[i], "root", *self.tbf_args(mbit)])
                self.dir_rates[i]["ingress"] = float(mbit)
            if direction in ("both", "egress"):
                self._run(["tc", "-n", self.namespaces[i], "qdisc", "change", "dev", "eth0", "root",
                           *self.tbf_args(mbit)])
                self.dir_rates[i]["egress"] = float(mbit)
            self.rates[i] = min(self.dir_rates[i].values())

    def qdisc_drops(self) -> dict[str, int]:
        """Packets each node's shapers dropped so far (``tc -s``): ``r<i>.up`` (the namespace's
        eth0) and ``r<i>.down`` (the root-namespace end). A drop costs a TCP retransmission — a
        collective-wide stall of ~200 ms or more (RTO) that the detector sees as noise."""
        import json as _json
        out = {}
        for i in range(self.nodes):
            for side, cmd in (("up", ["tc", "-n", self.namespaces[i], "-s", "-j", "qdisc", "show", "dev", "eth0"]),
                              ("down", ["tc", "-s", "-j", "qdisc", "show", "dev", self.host_links[i]])):
                r = self._run(cmd, check=False)
                try:
                    out[f"r{i}.{side}"] = sum(int(q.get("drops", 0)) for q in _json.loads(r.stdout or "[]"))
                except (ValueError, AttributeError):
                    out[f"r{i}.{side}"] = -1
        return out

    def destroy(self) -> None:
        """Remove every namespace and link of this run, then its state file (idempotent)."""
        if self.dry_run:
            return
        _remove(self.namespaces, [self.bridge, *self.host_links])
        try:
            self.state_file.unlink()
        except FileNotFoundError:
            pass
        self.created = False

    def __enter__(self) -> "Topology":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.destroy()


def _netns_list() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _link_list() -> list[str]:
    r = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True)
    out = []
    for line in r.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            out.append(parts[1].strip().split("@", 1)[0])
    return out


def _kill_netns_processes(ns: str) -> None:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    pids = [int(p) for p in r.stdout.split() if p.isdigit()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in pids if _pid_alive(p)]
        if not alive:
            return
        for p in alive:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_pid_alive(p) for p in alive):
            time.sleep(0.05)


def _remove(namespaces: list[str], links: list[str]) -> list[str]:
    """Kill processes left in the namespaces, delete them and the links; returns what went."""
    removed = []
    existing_ns = set(_netns_list())
    for ns in namespaces:
        if ns in existing_ns:
            _kill_netns_processes(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            removed.append(ns)
    existing_links = set(_link_list())
    for link in links:
        if link in existing_links:
            subprocess.run(["ip", "link", "del", link], capture_output=True)
            removed.append(link)
    return removed


def list_runs(state_dir: Path | None = None) -> list[dict]:
    """State files of test-bed runs (with ``alive``: is the owner process still running)."""
    d = Path(state_dir or STATE_DIR)
    out = []
    for f in sorted(d.glob("dtb*.json")) if d.is_dir() else []:
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        st["alive"] = _pid_alive(int(st.get("pid", 0))) if st.get("pid") else False
        st["state_file"] = str(f)
        out.append(st)
    return out


def cleanup(prefix: str | None = None, *, force: bool = False, state_dir: Path | None = None) -> list[str]:
    """Remove test-bed namespaces and links; returns the names removed.

    ``prefix``: that run only (even if its owner is alive). Otherwise every run whose owner is
    dead (all runs with ``force``), plus any ``dtbXXXX`` namespace or link that no live run owns.
    """
    if prefix is not None and not PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"prefix must look like dtb (or dtc) + 4 hex digits, got {prefix!r}")
    removed: list[str] = []
    # runs owned by a live process under the host's state directory are never orphans, whatever
    # ``state_dir`` this call looks at: a sweep with its own directory (a test's) must not take
    # down the host's other runs
    default = Path(STATE_DIR)
    live_prefixes = {st.get("prefix", "") for st in list_runs(default) if st["alive"]} \
        if Path(state_dir or default) != default else set()
    for st in list_runs(state_dir):
        p = st.get("prefix", "")
        if prefix is not None and p != prefix:
            if st["alive"]:
                live_prefixes.add(p)
            continue
        if prefix is None and st["alive"] and not force:
            live_prefixes.add(p)
            continue
        removed += _remove(list(st.get("netns", [])), list(st.get("links", [])))
        try:
            Path(st["state_file"]).unlink()
        except FileNotFoundError:
            pass
    # orphans: our naming scheme, no live owner
    def orphan(name: str) -> bool:
        m = PREFIX_RE.match(name)
        if not m:
            return False
        p = m.group(0)
        return (prefix is None or p == prefix) and p not in live_prefixes
    removed += _remove([ns for ns in _netns_list() if orphan(ns)],
                       [ln for ln in _link_list() if orphan(ln)])
    return removed
