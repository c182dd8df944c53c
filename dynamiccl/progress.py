"""A progress bar with ETA on stderr for long commands (``detector evaluate``, ``retuner evaluate``,
``report``), shown only to a person: stderr is a terminal, ``--log-format`` is not ``json`` and
``--no-progress`` is not given. CI logs and redirected output therefore never carry it, and stdout (where the
commands print their machine-readable last line) is never touched.

>>> import io
>>> progress_enabled(no_progress=False, log_format="text", stream=io.StringIO())   # not a terminal
False
>>> with progress(3, "runs", enabled=False) as step:
...     step()
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["progress_enabled", "enabled_for", "progress", "add_progress_flag"]


def add_progress_flag(parser) -> None:
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it is shown only when stderr is a terminal and logs are text)")


def progress_enabled(*, no_progress: bool, log_format: str | None, stream=None) -> bool:
    """The bar is for a person at a terminal: never with --no-progress, JSON logs or a non-TTY stderr."""
    stream = sys.stderr if stream is None else stream
    if no_progress or log_format == "json":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def enabled_for(args) -> bool:
    """:func:`progress_enabled` from a parsed command line (``--no-progress``, the global ``--log-format``)."""
    return progress_enabled(no_progress=getattr(args, "no_progress", False),
                            log_format=getattr(args, "log_format", None))


@contextmanager
def progress(total: int, description: str, *, enabled: bool, stream=None) -> Iterator[Callable[..., None]]:
    """Yield ``step(n=1)``, advancing a bar of ``total`` steps (elapsed, remaining) on ``stream`` (stderr).

    Disabled, ``step`` does nothing. Enabled, lines the command writes to stderr (and to stdout when that is
    the terminal too) are printed above the bar, and the bar is removed when the block ends."""
    if not enabled:
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    console = Console(file=sys.stderr if stream is None else stream)
    # stdout goes around the bar only when it is the terminal too; redirected, it stays untouched
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True,
                  redirect_stdout=sys.stdout.isatty()) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)

