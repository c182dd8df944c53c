"""The `dynamiccl` command: one entry point, one subcommand per pipeline role.

Each role's module exposes ``register(subparsers)``; it adds its parser and sets
``func=run``. Imports are lazy so `dynamiccl plugins` never pays for polars or torch.
"""
from __future__ import annotations

import argparse
import importlib
import os
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
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynamiccl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dynamiccl {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    parser.add_argument("--log-format", default="text", choices=("text", "json"),
                        help="text, or json: one JSON object per log line")
    parser.add_argument("--config-file", default=None, metavar="YAML",
                        help="flags of every command from a file (env DYNAMICCL_CONFIG_FILE); precedence: "
                             "command line > environment DYNAMICCL_<COMMAND>_<FLAG> > this file > defaults")
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


def _settings(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Flag defaults from the environment and the config file (dynamiccl/settings.py)."""
    from dynamiccl import settings
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config-file", default=os.environ.get(settings.CONFIG_ENV))
    path = pre.parse_known_args(sys.argv[1:] if argv is None else argv)[0].config_file
    settings.apply(parser, os.environ, settings.load_file(path) if path else {})


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        _settings(parser, argv)
    except (ValueError, OSError) as exc:
        print(f"dynamiccl: error: {exc}", file=sys.stderr)
        return 2
    from dynamiccl.settings import finish
    args = finish(parser.parse_args(argv))
    from dynamiccl.logfmt import configure
    configure(args.log_level, args.log_format)
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
