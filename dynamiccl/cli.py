"""The `dynamiccl` command: one entry point, one subcommand per pipeline role.

Each role's module exposes ``register(subparsers)``; it adds its parser and sets
``func=run``. Imports are lazy so `dynamiccl plugins` never pays for polars or torch.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from dynamiccl import __version__

# module path → registered by importing it; a module that does not exist yet is skipped
SUBCOMMAND_MODULES = (
    "dynamiccl.plugins",
    "collector.cli",
    "simulator.cli",
    "dynamiccl.demo",
    "detector.cli",
    "dynamiccl.stack",
    "dashboards.cli",
    "report.cli",
    "retuner.cli",
    "testbed.cli",
    "dynamiccl.validate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynamiccl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dynamiccl {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:
        print(f"dynamiccl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
