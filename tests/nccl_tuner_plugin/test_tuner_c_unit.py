"""The C unit tests (dynamiccl/nccl_tuner_plugin/test/test_tuner.c), plain, under AddressSanitizer + UBSan and
under valgrind; a warning-free build of the plugin; and its exported symbols."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from c_unit import REPO, assert_all_passed, assert_builds_without_warnings, make, run_unit_binary  # noqa: E402

TUNER_DIR = REPO / "dynamiccl" / "nccl_tuner_plugin"


def test_c_unit(built):
    run_unit_binary(built["test_tuner"], 23)


def test_c_unit_asan(built):
    assert_all_passed(make(TUNER_DIR, "test-asan"), 23)


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_c_unit_valgrind(built):
    assert_all_passed(make(TUNER_DIR, "test-valgrind"), 23)


def test_plugin_builds_without_warnings(built, tmp_path):
    assert_builds_without_warnings(TUNER_DIR, sorted(p.name for p in (TUNER_DIR / "src").glob("*.c")), tmp_path / "t.so", "-Wshadow")


def test_exports_only_the_abi_and_control_functions(built):
    out = subprocess.run(["nm", "-D", "--defined-only", str(built["plugin"])], capture_output=True, text=True,
                         check=True).stdout
    names = {ln.split()[-1] for ln in out.splitlines() if ln.strip()}
    assert {"ncclTunerPlugin_v7", "ncclTunerPlugin_v6", "ncclTunerPlugin_v5", "ncclTunerPlugin_v4"} <= names
    ours = {n for n in names if not n.startswith("_")}
    assert all(n.startswith(("ncclTunerPlugin_v", "dynamiccl_tuner_")) for n in ours), ours
