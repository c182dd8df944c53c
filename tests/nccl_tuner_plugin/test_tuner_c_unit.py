"""The C unit tests (nccl_tuner_plugin/test/test_tuner.c), plain, under AddressSanitizer + UBSan and
under valgrind; plus a warning-free build of the plugin and of the profiler with its tuner link."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUNER_DIR = REPO / "nccl_tuner_plugin"


def _make(target: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(TUNER_DIR), target], capture_output=True, text=True, timeout=timeout)


def test_c_unit(built):
    r = subprocess.run([str(built["test_tuner"])], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "14/14 passed" in r.stdout, r.stdout


def test_c_unit_asan(built):
    r = _make("test-asan")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "14/14 passed" in r.stdout and "FAIL" not in r.stdout and "ERROR: AddressSanitizer" not in r.stderr


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_c_unit_valgrind(built):
    r = _make("test-valgrind")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "14/14 passed" in r.stdout


def test_plugin_builds_without_warnings(built, tmp_path):
    srcs = [str(TUNER_DIR / "src" / f) for f in ("tuner.c", "control.c", "rules.c")]
    r = subprocess.run(["cc", "-std=c11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Wshadow", "-fvisibility=hidden",
                        "-pthread", "-I", str(TUNER_DIR / "include"), "-I", str(TUNER_DIR / "src"), *srcs,
                        "-o", str(tmp_path / "t.so")], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_exports_only_the_abi_and_control_functions(built):
    out = subprocess.run(["nm", "-D", "--defined-only", str(built["plugin"])], capture_output=True, text=True,
                         check=True).stdout
    names = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
    assert {"ncclTunerPlugin_v6", "ncclTunerPlugin_v5", "ncclTunerPlugin_v4"} <= names
    ours = {n for n in names if not n.startswith("_")}
    assert all(n.startswith(("ncclTunerPlugin_v", "dynamiccl_tuner_")) for n in ours), ours
