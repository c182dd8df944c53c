"""The C unit tests (nccl_profiler_plugin/test/test_plugin.c), plain, under AddressSanitizer +
UBSan and under valgrind; plus valgrind on the emulator driving the real .so (sender thread,
sockets) and a warning-free build check."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "nccl_profiler_plugin"


def _make(target: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(PLUGIN_DIR), target], capture_output=True, text=True, timeout=timeout)


def test_c_unit(built):
    r = subprocess.run([str(built["test_plugin"])], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "18/18 passed" in r.stdout, r.stdout


def test_c_unit_asan(built):
    r = _make("test-asan")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "passed" in r.stdout and "FAIL" not in r.stdout and "ERROR: AddressSanitizer" not in r.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_c_unit_valgrind(built):
    r = _make("test-valgrind")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_emulator_under_valgrind(built, sock_addr, collector_factory):
    col = collector_factory(sock_addr)
    r = subprocess.run(["valgrind", "--quiet", "--error-exitcode=3", "--leak-check=full",
                        "--errors-for-leak-kinds=definite", str(built["emulate"]), str(built["plugin"]),
                        "--colls", "2000", "--warmup", "0", "--threads", "2", "--comms", "2"],
                       capture_output=True, text=True, timeout=300, env={"DYNAMICCL_COLLECTOR": sock_addr})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "records_sent=2000" in r.stdout
    assert col.wait_for(lambda: len(col.events()) == 2000)


def test_plugin_builds_without_warnings(built, tmp_path):
    srcs = [str(PLUGIN_DIR / "src" / f) for f in ("plugin.c", "config.c", "sender.c")]
    r = subprocess.run(["cc", "-std=c11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-fvisibility=hidden",
                        "-pthread", "-I", str(PLUGIN_DIR / "include"), "-I", str(PLUGIN_DIR / "src"), *srcs,
                        "-o", str(tmp_path / "p.so")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
