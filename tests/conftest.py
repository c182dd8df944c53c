"""Shared fixtures. The C plugin is built in place with make (a no-op when up to date)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def built_profiler() -> Path:
    """Path of the profiler plugin built from this checkout."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and a C compiler are needed to build the plugin")
    subprocess.run(["make", "-s", "-C", str(ROOT / "dynamiccl" / "nccl_profiler_plugin")], check=True)
    from dynamiccl import nccl_profiler_plugin
    return nccl_profiler_plugin.library_path()
