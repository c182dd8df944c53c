"""The base install: no third-party package, and still `dynamiccl plugins`, the agreement hook and the
contracts; a subcommand whose extra is missing says which extra in one line.

A child interpreter refuses every module that is neither the standard library's nor this project's, which is
what a fresh `pip install dynamiccl` without extras has (the fresh-venv check itself is in .ci/run).
"""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

BLOCK = """
import importlib.abc, sys
FIRST = {"dynamiccl"}
class OnlyStdlib(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in FIRST or top.startswith("_"):
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (blocked: not installed)", name=name)
sys.meta_path.insert(0, OnlyStdlib())
"""


def run_bare(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    full_env = {"PATH": "/usr/bin:/bin", "DYNAMICCL_PROFILER_LIB": str(lib), "DYNAMICCL_TUNER_LIB": str(lib), **env}
    return subprocess.run([sys.executable, "-S", "-c", BLOCK + code], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=60)


def test_dynamiccl_plugins_works_without_any_third_party_package(tmp_path):
    r = run_bare("import sys; sys.path.insert(0, '.'); from dynamiccl.cli import main; sys.exit(main(['plugins']))",
                 tmp_path)
    assert r.returncode == 0, r.stderr
    assert "export NCCL_PROFILER_PLUGIN=" in r.stdout and "export NCCL_TUNER_PLUGIN=" in r.stdout


def test_the_training_node_imports_need_no_third_party_package(tmp_path):
    r = run_bare("import sys; sys.path.insert(0, '.')\n"
                 "import dynamiccl.contracts, dynamiccl.nccl_tuner_plugin.sync, dynamiccl.nccl_tuner_plugin.config, "
                 "dynamiccl.nccl_profiler_plugin\n"
                 "from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, format_configs, parse_configs\n"
                 "c = [TunerConfig(1, (Rule('AllToAll', 0, 1 << 20, 'RING', 'LL'),))]\n"
                 "assert parse_configs(format_configs(c)) == c\n"
                 "print('ok')", tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("argv,extra,module", [
    (["simulate", "run"], "services", "numpy"),
    (["retuner", "run"], "services", None),
    (["detector", "run"], "services", "numpy"),
    (["report", "x"], "report", None),
    (["stack", "up"], "services", "yaml"),
])
def test_a_subcommand_without_its_extra_names_the_extra_in_one_line(tmp_path, argv, extra, module):
    r = run_bare(f"import sys; sys.path.insert(0, '.'); from dynamiccl.cli import main; sys.exit(main({argv!r}))",
                 tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"dynamiccl {argv[0]}: needs the [{extra}] extra")
    assert f"pip install 'dynamiccl[{extra}]'" in lines[0]
    if module:
        assert f"module {module!r}" in lines[0]


def test_the_base_install_declares_no_dependency_and_no_extra_replaces_urllib3():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["dependencies"] == []
    every = " ".join(d for deps in meta["optional-dependencies"].values() for d in deps).lower()
    for name in ("grafana-client", "niquests", "urllib3-future"):
        assert name not in every, name
    assert not any(d.replace(" ", "").startswith("torch==") for deps in meta["optional-dependencies"].values()
                   for d in deps), "an exact torch pin would replace the user's torch"
