"""The C unit tests (dynamiccl/nccl_profiler_plugin/test/test_plugin.c), plain, under AddressSanitizer +
UBSan and under valgrind; plus valgrind on the emulator driving the real .so (sender thread,
sockets) and a warning-free build check."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from c_unit import REPO, assert_all_passed, assert_builds_without_warnings, make, run_unit_binary  # noqa: E402

PLUGIN_DIR = REPO / "dynamiccl" / "nccl_profiler_plugin"


def test_c_unit(built):
    run_unit_binary(built["test_plugin"], 47)


def test_c_unit_asan(built):
    assert_all_passed(make(PLUGIN_DIR, "test-asan"))


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_c_unit_valgrind(built):
    assert_all_passed(make(PLUGIN_DIR, "test-valgrind"))


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
    assert_builds_without_warnings(PLUGIN_DIR, sorted(p.name for p in (PLUGIN_DIR / "src").glob("*.c")), tmp_path / "p.so")


def test_c_unit_tsan(built):
    assert_all_passed(make(PLUGIN_DIR, "test-tsan"), 47)


def test_emulator_under_tsan(built):
    """Two threads per communicator, two communicators and the sender thread, TSan-instrumented; alone,
    with a chained profiler (DYNAMICCL_PROFILER_CHAIN) and with the record clock forced to clock_gettime
    (DYNAMICCL_CLOCK=0; the default is the TSC where it qualifies, whose anchor the sender rewrites while the event
    threads read it)."""
    r = make(PLUGIN_DIR, "emu-tsan")
    assert r.returncode == 0 and "WARNING: ThreadSanitizer" not in r.stderr, r.stdout + r.stderr
    assert r.stdout.count("records_emitted=20000") == 3, r.stdout  # alone, chained, clock_gettime clock
    assert "records_emitted=60000" in r.stdout, r.stdout  # per-peer timing: + 2 PEER records per operation
    assert "bad_handles=0 foreign_parents=0 double_stops=0" in r.stdout, r.stdout


def test_emulator_under_asan_real_paths(built):
    """ASan+UBSan builds of the plugin and the emulator: plain, CollNet (late children refused),
    copy-engine and v7 KernelPhase runs, each with two threads, two communicators and the sender."""
    r = make(PLUGIN_DIR, "emu-asan")
    assert r.returncode == 0 and "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, \
        r.stdout + r.stderr
    assert r.stdout.count("records_emitted=20000") == 5, r.stdout
    assert "records_emitted=60000" in r.stdout, r.stdout  # per-peer timing (EMU_F_NET)
    assert "bad_handles=0 foreign_parents=0 double_stops=0" in r.stdout, r.stdout
