"""`dynamiccl plugins`: print where the NCCL plugins are and the lines to export."""
from __future__ import annotations

import argparse

import nccl_profiler_plugin


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plugins", help="print the NCCL plugin paths and the export lines to paste")
    p.add_argument("--profiler", action="store_true", help="print only the profiler plugin path")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = nccl_profiler_plugin.library_path()
    if args.profiler:
        print(path)
        return 0
    print(f"# profiler plugin: {path}")
    print(f"export NCCL_PROFILER_PLUGIN={path}")
    print("export DYNAMICCL_COLLECTOR=unix:/tmp/dynamiccl.sock   # where `dynamiccl collector` listens")
    return 0
