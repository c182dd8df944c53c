"""Fixtures for the profiler plugin tests: build with make, a fake collector that decodes
frames with the wire-format dtypes, and a runner for emulator scenarios (emu_driver.py)."""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "dynamiccl" / "nccl_profiler_plugin"
BUILD = PLUGIN_DIR / "test" / "build"
sys.path.insert(0, str(REPO))

from dynamiccl.collector import wire_format as wf  # noqa: E402
from dynamiccl.collector.decode import HEADER_SIZE, ProtocolError, read_frames  # noqa: E402

KIND_DTYPES = {wf.Kind.COLL: wf.EVENT_DTYPE, wf.Kind.P2P: wf.EVENT_DTYPE, wf.Kind.COMM: wf.COMM_DTYPE,
               wf.Kind.PROCESS: wf.PROCESS_DTYPE, wf.Kind.STATS: wf.STATS_DTYPE, wf.Kind.PEER: wf.PEER_DTYPE}


@pytest.fixture(scope="session")
def built() -> dict[str, Path]:
    """Build the plugin, the emulator and the unit tests once per session."""
    subprocess.run(["make", "-s", "-C", str(PLUGIN_DIR), "libnccl-profiler-dynamiccl.so", "emulator",
                    "test/build/test_plugin"], check=True, capture_output=True, text=True)
    return {
        "plugin": PLUGIN_DIR / "libnccl-profiler-dynamiccl.so",
        "noop": BUILD / "libnccl-profiler-noop.so",
        "emulate": BUILD / "emulate",
        "emu_lib": PLUGIN_DIR / "emulator" / "libdccl-nccl-emu.so",
        "test_plugin": BUILD / "test_plugin",
        "chain_probe": BUILD / "libchain-probe.so",
    }


# Collectors of the running test (collector_factory): run_scenario lets them finish reading.
_LIVE_COLLECTORS: list["FakeCollector"] = []


class FakeCollector:
    """Accepts plugin connections on a Unix or TCP socket and decodes every frame.

    ``connections`` is a list (one per accepted connection) of lists of decoded records
    (numpy records of the dtype their kind selects). ``kill()`` closes everything abruptly, as a
    crashed collector would."""

    def __init__(self, addr: str):
        self.addr = addr
        self.connections: list[list[np.void]] = []
        self.bad_frames = 0  # undecodable, or more frames than records (a frame without one)
        self.frames = 0
        self._socks: list[socket.socket] = []
        self._readers: list[threading.Thread] = []
        self._accepting = False
        self._lock = threading.Lock()
        if addr.startswith("unix:"):
            path = addr[5:]
            if os.path.exists(path):
                os.unlink(path)
            self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._srv.bind(path)
        else:
            host, port = addr[4:].rsplit(":", 1)
            self._srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._srv.bind((host, int(port)))
        self._srv.listen(16)
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            with self._lock:
                self._accepting = True  # until its reader is registered
                recs: list[np.void] = []
                self.connections.append(recs)
                self._socks.append(conn)
            t = threading.Thread(target=self._read, args=(conn, recs), daemon=True)
            t.start()
            with self._lock:
                self._readers.append(t)
                self._accepting = False

    def settle(self, timeout: float = 10.0) -> None:
        """After a blocking scenario's process exited (its frames are all in socket buffers): wait
        until no connection is left waiting to be accepted and every accepted one was read to its
        end, or `timeout` seconds."""
        deadline, idle = time.monotonic() + timeout, 0
        while time.monotonic() < deadline and idle < 3:  # idle on 3 polls: accept() has not just returned
            try:
                pending = bool(select.select([self._srv], [], [], 0)[0])
            except (OSError, ValueError):  # killed
                return
            with self._lock:
                busy = pending or self._accepting or any(t.is_alive() for t in self._readers)
            idle = 0 if busy else idle + 1
            time.sleep(0.005)

    def _read(self, conn: socket.socket, recs: list) -> None:
        try:
            for rows, used in read_frames(conn):
                n = 0 if rows is None else len(rows)
                # split_frames accepts 0-record frames; the plugin never sends one. The frames in `used`
                # bytes number (used - 128 * records) / 16: more frames than records is counted bad.
                frames = (used - n * wf.RECORD_SIZE) // HEADER_SIZE
                with self._lock:
                    self.frames += frames
                    self.bad_frames += max(0, frames - n)
                    for row in ([] if rows is None else rows):
                        recs.append(row.view(KIND_DTYPES.get(int(row["kind"]), wf.EVENT_DTYPE)).copy())
        except ProtocolError:
            self.bad_frames += 1

    def records(self, kind: int | None = None, conn: int | None = None) -> list[np.void]:
        with self._lock:
            conns = self.connections if conn is None else [self.connections[conn]]
            return [r for c in conns for r in c if kind is None or int(r["kind"]) == kind]

    def events(self, conn: int | None = None) -> np.ndarray:
        recs = [r for r in self.records(conn=conn) if int(r["kind"]) in (wf.Kind.COLL, wf.Kind.P2P)]
        return np.array(recs, dtype=wf.EVENT_DTYPE)

    def wait_for(self, pred, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.01)
        return pred()

    def kill(self) -> None:
        self._stop = True
        try:
            self._srv.close()
        except OSError:
            pass
        with self._lock:
            for s in self._socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
        if self.addr.startswith("unix:") and os.path.exists(self.addr[5:]):
            os.unlink(self.addr[5:])


@pytest.fixture
def sock_addr(tmp_path) -> str:
    return f"unix:{tmp_path}/c.sock"


@pytest.fixture
def collector_factory():
    made: list[FakeCollector] = []

    def make(addr: str) -> FakeCollector:
        c = FakeCollector(addr)
        made.append(c)
        _LIVE_COLLECTORS.append(c)
        return c

    yield make
    for c in made:
        c.kill()
        _LIVE_COLLECTORS.remove(c)


def _base_env(addr: str, extra: dict | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYNAMICCL_")}
    # NCCL's pre-2.29 Broadcast path (a Coll event), which the emulator and the plugin both follow, so
    # these scenarios' Broadcasts are ordinary collectives on every ABI; the 2.29+ default (no Coll
    # event, an API-level record) is its own test (test_real_paths.py), which sets this itself
    env["NCCL_ALLGATHERV_ENABLE"] = "0"
    env["DYNAMICCL_COLLECTOR"] = addr
    env["DYNAMICCL_JOB_ID"] = "job-test"
    env.update(extra or {})
    return env


def _spawn(built, tmp_path, steps, addr, abi, env):
    spec = {"plugin": str(built["plugin"]), "abi": abi, "steps": steps}
    path = tmp_path / f"spec{time.monotonic_ns()}.json"
    path.write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, str(Path(__file__).with_name("emu_driver.py")), str(path)],
                            env=_base_env(addr, env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=60) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"driver exited {proc.returncode}\nstdout:{out}\nstderr:{err}"
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, f"no result\nstdout:{out}\nstderr:{err}"
    res = json.loads(lines[-1])
    res["stderr"] = err
    return res


@pytest.fixture
def run_scenario(built, tmp_path):
    """run_scenario(steps, addr, abi=6, env=None) -> result dict (blocking)."""
    def run(steps, addr, abi=6, env=None, timeout=60):
        res = _finish(_spawn(built, tmp_path, steps, addr, abi, env), timeout)
        for c in _LIVE_COLLECTORS:  # the process exited: let the collectors read what it sent
            c.settle()
        return res
    return run


@pytest.fixture
def start_scenario(built, tmp_path):
    """start_scenario(...) -> (proc, finish) for scenarios the test interacts with while they run."""
    def start(steps, addr, abi=6, env=None):
        proc = _spawn(built, tmp_path, steps, addr, abi, env)
        return proc, (lambda timeout=60: _finish(proc, timeout))
    return start
