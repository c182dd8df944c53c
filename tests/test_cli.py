"""The `dynamiccl` entry point: subcommands register, `plugins` prints usable export lines."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dynamiccl.cli import build_parser, main


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in ("plugins", "collector"):
        assert command in out


def test_plugins_prints_existing_library(built_profiler, capsys):
    assert main(["plugins"]) == 0
    lines = capsys.readouterr().out.splitlines()
    export = [ln for ln in lines if ln.startswith("export NCCL_PROFILER_PLUGIN=")]
    assert len(export) == 1
    path = Path(export[0].split("=", 1)[1])
    assert path.is_file() and path.name == "libnccl-profiler-dynamiccl.so"


def test_plugins_missing_library_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DYNAMICCL_PROFILER_LIB", str(tmp_path / "nope.so"))
    assert main(["plugins"]) == 2
    err = capsys.readouterr().err
    assert "profiler plugin not found" in err and "make -C" in err


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "dynamiccl", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("dynamiccl ")


def test_parser_builds_without_heavy_imports():
    code = ("import sys; from dynamiccl.cli import build_parser; build_parser(); "
            "print(','.join(m for m in ('torch',) if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == ""
