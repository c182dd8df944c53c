"""The demo's end-to-end runs need both C plugins and the emulator built from this checkout."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built_plugins() -> Path:
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and a C compiler are needed to build the plugins")
    subprocess.run(["make", "-s", "-C", str(ROOT / "dynamiccl" / "nccl_profiler_plugin"), "libnccl-profiler-dynamiccl.so",
                    "emulator"], check=True)
    subprocess.run(["make", "-s", "-C", str(ROOT / "dynamiccl" / "nccl_tuner_plugin"), "libnccl-tuner-dynamiccl.so"], check=True)
    return ROOT
