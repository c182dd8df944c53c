"""Progress bars with ETA: shown on stderr only to a person at a terminal (not with --no-progress, JSON logs or
a redirected stderr), and the commands' machine-readable last line on stdout is the same either way."""
from __future__ import annotations

import io
import re
import sys

import pytest

from dynamiccl.cli import build_parser, main
from dynamiccl.progress import progress, progress_enabled


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("no_progress,log_format,tty,shown", [
    (False, "text", True, True),
    (False, None, True, True),
    (True, "text", True, False),      # --no-progress
    (False, "json", True, False),     # --log-format json: log lines only
    (False, "text", False, False),    # CI log, file, pipe
])
def test_bar_only_for_a_terminal(no_progress, log_format, tty, shown):
    stream = _Tty() if tty else io.StringIO()
    assert progress_enabled(no_progress=no_progress, log_format=log_format, stream=stream) is shown


def test_enabled_bar_writes_stderr_only_with_eta(capsys):
    err = _Tty()
    with progress(4, "runs", enabled=True, stream=err) as step:
        for _ in range(4):
            step()
    assert "ETA" in err.getvalue() and "runs" in err.getvalue()
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("argv", [["detector", "evaluate", "--no-progress"],
                                  ["retuner", "evaluate", "--no-progress"],
                                  ["report", "somewhere", "--no-progress"]])
def test_long_commands_take_no_progress(argv):
    assert build_parser().parse_args(argv).no_progress is True


def _last_line(out: str) -> str:
    return re.sub(r"wall_s=\S+", "wall_s=X", out.strip().splitlines()[-1])


def test_report_last_line_is_the_same_with_the_bar(tmp_path, monkeypatch, capsys):
    from dynamiccl.harness.synthetic_run import write_run
    d = str(tmp_path / "parquet")
    write_run(d, records=20_000, seed=3, rate_per_s=500.0, chunk_records=10_000, flush_rows=10_000)
    assert main(["report", d, "-o", str(tmp_path / "a.html"), "--no-progress"]) == 0
    plain = capsys.readouterr()
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["report", d, "-o", str(tmp_path / "a.html")]) == 0
    barred = capsys.readouterr()
    assert "ETA" in err.getvalue()                      # the bar was drawn, on stderr
    assert "ETA" not in plain.err + plain.out + barred.out
    assert _last_line(barred.out) == _last_line(plain.out)
    assert barred.out.splitlines()[:-1] == plain.out.splitlines()[:-1]
