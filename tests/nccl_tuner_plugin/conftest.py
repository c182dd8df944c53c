"""Fixtures for the tuner plugin tests: build with make once per session; private plugin instances."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TUNER_DIR = REPO / "dynamiccl" / "nccl_tuner_plugin"
BUILD = TUNER_DIR / "test" / "build"
sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def built() -> dict[str, Path]:
    """Build the plugin, the unit tests and the benchmark harness once per session."""
    subprocess.run(["make", "-s", "-C", str(TUNER_DIR), "libnccl-tuner-dynamiccl.so", "test/build/test_tuner", "bench"],
                   check=True, capture_output=True, text=True)
    return {
        "plugin": TUNER_DIR / "libnccl-tuner-dynamiccl.so",
        "test_tuner": BUILD / "test_tuner",
        "noop": BUILD / "libnccl-tuner-noop.so",
        "bench": BUILD / "libdccl-tuner-bench.so",
    }


@pytest.fixture
def private_plugin(built, tmp_path):
    """factory(mode="immediate", abi=6) -> a private TunerPlugin instance reading tmp_path/<n>.conf (no thread)."""
    from dynamiccl.harness.simulator.tuner_abi import TunerPlugin

    made = []

    def make(mode: str = "immediate", abi: int = 6, poll_ms: int = 0):
        p = TunerPlugin.private_copy(built["plugin"], abi, tmp_dir=tmp_path)
        p.conf = tmp_path / f"tuner-{len(made)}.conf"
        p.configure(p.conf, mode=mode, poll_ms=poll_ms)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()
