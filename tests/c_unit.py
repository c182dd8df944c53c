"""What the two plugins' C-test runners share: `make` targets, the unit binary's pass line, and a strict
warning-free build (tests/nccl_profiler_plugin/test_c_unit.py, tests/nccl_tuner_plugin/test_tuner_c_unit.py)."""
from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make(plugin_dir: Path, target: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(plugin_dir), target], capture_output=True, text=True, timeout=timeout)


def assert_all_passed(r: subprocess.CompletedProcess, n_tests: int | None = None) -> None:
    """The C harness prints `N/N passed` and a FAIL line per failed check; sanitizers print ERROR lines."""
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "ERROR: AddressSanitizer" not in r.stderr, r.stdout + r.stderr
    assert (f"{n_tests}/{n_tests} passed" if n_tests else "passed") in r.stdout, r.stdout


def run_unit_binary(binary: Path, n_tests: int) -> None:
    assert_all_passed(subprocess.run([str(binary)], capture_output=True, text=True, timeout=120), n_tests)


def assert_builds_without_warnings(plugin_dir: Path, sources: list[str], out: Path, *extra_flags: str) -> None:
    srcs = [str(plugin_dir / "src" / f) for f in sources]
    r = subprocess.run(["cc", "-std=c11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", *extra_flags,
                        "-fvisibility=hidden", "-pthread", "-I", str(plugin_dir / "include"),
                        "-I", str(plugin_dir / "src"), *srcs, "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
