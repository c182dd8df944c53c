"""DynamICCL's NCCL profiler plugin (C). This Python package only locates the built library.

Point NCCL at it with ``export NCCL_PROFILER_PLUGIN=$(dynamiccl plugins --profiler)``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LIBRARY_NAME", "library_path"]

LIBRARY_NAME = "libnccl-profiler-dynamiccl.so"


def library_path() -> Path:
    """Return the path of the built profiler plugin.

    ``DYNAMICCL_PROFILER_LIB`` overrides the location. Raises ``FileNotFoundError`` with the
    command that builds it when the library is missing (e.g. a source checkout never built).
    """
    override = os.environ.get("DYNAMICCL_PROFILER_LIB")
    path = Path(override) if override else Path(__file__).with_name(LIBRARY_NAME)
    if not path.is_file():
        raise FileNotFoundError(
            f"profiler plugin not found at {path}; build it with "
            f"`make -C {Path(__file__).parent}` or reinstall with `pip install .`")
    return path
