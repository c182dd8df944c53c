"""`dynamiccl plugins`: print where the NCCL plugins are and the lines to export."""
from __future__ import annotations

import argparse

from dynamiccl import nccl_profiler_plugin
from dynamiccl import nccl_tuner_plugin
from dynamiccl.contracts.runtime_paths import default_socket, default_tuner_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="print the NCCL plugin paths and the export lines to paste")
    p.add_argument("--profiler", action="store_true", help="print only the profiler plugin path")
    p.add_argument("--tuner", action="store_true", help="print only the tuner plugin path")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "tuner", False):
        print(nccl_tuner_plugin.library_path())
        return 0
    path = nccl_profiler_plugin.library_path()
    if args.profiler:
        print(path)
        return 0
    print(f"# profiler plugin: {path}")
    print(f"export NCCL_PROFILER_PLUGIN={path}")
    print(f"export DYNAMICCL_COLLECTOR=unix:{default_socket()}   # where `dynamiccl collector` listens")
    try:
        tuner = nccl_tuner_plugin.library_path()
    except FileNotFoundError as e:
        print(f"# tuner plugin: not built ({e})")
        return 0
    print(f"# tuner plugin: {tuner} (retuning; add dynamiccl.nccl_tuner_plugin.sync.agree() at a step boundary)")
    print(f"export NCCL_TUNER_PLUGIN={tuner}")
    print(f"export DYNAMICCL_TUNER_CONFIG={default_tuner_config()}   # what the retuner writes")
    return 0
