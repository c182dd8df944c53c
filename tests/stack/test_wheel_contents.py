"""The wheel carries what `dynamiccl stack up` reads (deploy/ and the dashboards), so the native stack
works from a plain `pip install` without a checkout (slow: builds the wheel)."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_ships_stack_configuration_and_the_stack_finds_it(tmp_path):
    out = tmp_path / "wheel"
    # build isolation, as `pip install .` does: the build backend (hatchling) need not be
    # installed in the test environment (a fresh venv has only what the README installs)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "-q", "-w", str(out)], check=True, timeout=600)
    whl = next(out.glob("dynamiccl-*.whl"))
    names = set(zipfile.ZipFile(whl).namelist())
    for rel in Path(ROOT / "deploy").rglob("*"):
        if rel.is_file():
            assert f"dynamiccl/deploy/{rel.relative_to(ROOT / 'deploy').as_posix()}" in names, rel
    assert {f"dynamiccl/dashboards/json/{p.name}" for p in (ROOT / "dynamiccl/dashboards/json").glob("*.json")} <= names
    # installed layout (no checkout around it): the stack resolves and validates the shipped copy
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    code = ("from dynamiccl.stack import StackConfig, DEFAULT_DEPLOY_DIR; "
            "c = StackConfig.from_env({}).validate(); print(DEFAULT_DEPLOY_DIR); print(c.dashboards_dir)")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert res.returncode == 0, res.stderr
    deploy, dashboards = res.stdout.split()
    assert Path(deploy) == site / "dynamiccl" / "deploy"
    assert Path(dashboards) == site / "dynamiccl" / "dashboards" / "json"
