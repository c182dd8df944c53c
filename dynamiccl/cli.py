"""The `dynamiccl` command: one entry point, one subcommand per pipeline role.

Each role's module exposes ``register(subparsers)``; it adds its parser and sets
``func=run``. Imports are lazy so `dynamiccl plugins` never pays for polars or torch, and works on the base
install (no third-party package): a subcommand whose extra is missing says which one to install.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from dynamiccl import __version__

# module path → the subcommands it registers and the extra they need (None: the base install). A module whose
# third-party imports are missing still gets its subcommands, which then say which extra to install.
SUBCOMMANDS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("dynamiccl.plugins", ("plugins",), None),
    ("dynamiccl.collector.cli", ("collector",), "services"),
    ("dynamiccl.harness.simulator.cli", ("simulate",), "services"),
    ("dynamiccl.demo", ("demo",), "services"),
    ("dynamiccl.detector.cli", ("detector",), "services"),
    ("dynamiccl.stack", ("stack",), "services"),
    ("dynamiccl.dashboards.cli", ("dashboards",), "services"),
    ("dynamiccl.report.cli", ("report", "replay"), "report"),
    ("dynamiccl.retuner.cli", ("retuner",), "services"),
    ("dynamiccl.harness.testbed.cli", ("testbed",), "services"),
    ("dynamiccl.validate", ("validate-nccl",), "node"),                     # numpy + the user's torch (docs/real-nccl.md)
    ("dynamiccl.scaleout.cli", ("node", "central", "nats-auth"), "scale"),  # docs/scale-out.md
)
SUBCOMMAND_MODULES = tuple(m for m, _, _ in SUBCOMMANDS)
COMMAND_EXTRA = {c: extra for _, cmds, extra in SUBCOMMANDS for c in cmds}
#: third-party module → the extra that installs it (when a command's own extra is not the one)
MODULE_EXTRA = {"torch": "autoencoder", "plotly": "report", "grafana_foundation_sdk": "test",
                "jsonschema": "test"}
FIRST_PARTY = ("dynamiccl",)


def missing_extra(command: str, module: str) -> str:
    """The one line that tells the user which extra brings ``module`` for ``command``."""
    top = module.split(".")[0]
    extra = MODULE_EXTRA.get(top) or COMMAND_EXTRA.get(command) or "services"
    return (f"dynamiccl {command}: needs the [{extra}] extra (module {top!r} is not installed): "
            f"pip install 'dynamiccl[{extra}]'")


def _is_third_party(exc: ModuleNotFoundError) -> bool:
    return bool(exc.name) and exc.name.split(".")[0] not in FIRST_PARTY


def _placeholder(sub, command: str, exc: ModuleNotFoundError) -> None:
    p = sub.add_parser(command, help=f"(needs the [{COMMAND_EXTRA[command]}] extra)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: _refuse(command, exc.name))


def _refuse(command: str, module: str) -> int:
    print(missing_extra(command, module), file=sys.stderr)
    return 2


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
    for name, commands, _extra in SUBCOMMANDS:
        try:
            importlib.import_module(name).register(sub)
        except ModuleNotFoundError as exc:
            if not _is_third_party(exc):        # every role ships in the package: a missing one is a bug
                raise
            for command in commands:
                if command not in sub.choices:  # register() may have added some before it failed
                    _placeholder(sub, command, exc)
    return parser


def _settings(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Flag defaults from the environment and the config file (dynamiccl/settings.py)."""
    from dynamiccl import settings
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config-file", default=os.environ.get(settings.CONFIG_ENV))
    path = pre.parse_known_args(sys.argv[1:] if argv is None else argv)[0].config_file
    settings.apply(parser, os.environ, settings.load_file(path) if path else {})


_hard_exit = False   # set by a command whose process ends without interpreter teardown


def entry() -> None:
    """The console script: ``main``, then the exit. A service that finished its own shutdown
    (the collector) leaves with ``os._exit``: tearing a large heap down took 0.7-2.4 s under
    load, past the 5 s a SIGTERM may take."""
    rc = main()
    if _hard_exit:
        import logging
        import os
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)


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
    global _hard_exit
    _hard_exit = bool(getattr(args, "hard_exit", False))
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:          # a lazy import of a package an extra brings
        if not _is_third_party(exc):
            raise
        print(missing_extra(args.command, exc.name), file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"dynamiccl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
