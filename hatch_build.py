"""Hatchling build hook: compile the C plugins with make and ship the .so files in the wheel.

The plugins need only gcc and libc (no CUDA, no NCCL). Set DYNAMICCL_SKIP_PLUGIN=1 to build a
pure-Python wheel (slim service images that never load the plugins).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PLUGINS = {
    # folder: shared libraries its Makefile builds in place (paths relative to the folder)
    "dynamiccl/nccl_profiler_plugin": ("libnccl-profiler-dynamiccl.so", "emulator/libdccl-nccl-emu.so"),
    "dynamiccl/nccl_tuner_plugin": ("libnccl-tuner-dynamiccl.so",),
}


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version, build_data):
        if self.target_name != "wheel" or os.environ.get("DYNAMICCL_SKIP_PLUGIN") == "1":
            return
        if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
            raise RuntimeError(
                "dynamiccl: building the NCCL plugins needs `make` and a C compiler (cc/gcc), "
                "and none was found on PATH. Install them (Debian: apt-get install build-essential) "
                "or set DYNAMICCL_SKIP_PLUGIN=1 to install without the plugins.")
        for folder, libs in PLUGINS.items():
            src = os.path.join(self.root, folder)
            if not os.path.exists(os.path.join(src, "Makefile")):
                continue
            subprocess.run(["make", "-C", src, *libs], check=True)
            for lib in libs:
                build_data["force_include"][os.path.join(src, lib)] = f"{folder}/{lib}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = False
        build_data["tag"] = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")
