"""The per-user, per-job default paths (issue 18 #8): one rule in Python, mirrored in C; both agree."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dynamiccl.contracts import runtime_paths as rp

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "dynamiccl" / "contracts" / "dynamiccl_paths.h"

CASES = [
    {},
    {"XDG_RUNTIME_DIR": "/run/user/1234"},
    {"XDG_RUNTIME_DIR": "/run/user/1234//"},
    {"XDG_RUNTIME_DIR": "relative/dir"},             # not absolute: ignored
    {"SLURM_JOB_ID": "4711"},
    {"SLURM_JOB_ID": "4711", "DYNAMICCL_JOB_ID": "train.a-1"},
    {"DYNAMICCL_JOB_ID": "../etc", "SLURM_JOB_ID": "9"},   # a job id that would escape: ignored
    {"DYNAMICCL_JOB_ID": "x" * 65},
    {"DYNAMICCL_JOB_ID": ".."},
    {"XDG_RUNTIME_DIR": "/run/user/7", "SLURM_JOB_ID": "12"},
]

C_MAIN = r"""
#define _GNU_SOURCE
#include "dynamiccl_paths.h"
int main(void) {
  char a[4096], b[4096], err[256];
  if (dynamiccl_check_private_dir("/nonexistent-dccl", err, sizeof err) == 0) return 3;
  if (dynamiccl_default_path(a, sizeof a, "collector", "sock") || dynamiccl_default_path(b, sizeof b, "tuner", "conf"))
    return 2;
  printf("%s\n%s\n", a, b);
  return 0;
}
"""


def test_python_rule():
    uid = os.getuid()
    assert rp.default_socket({}) == f"/tmp/dynamiccl-{uid}/collector.sock"
    assert rp.default_tuner_config({"XDG_RUNTIME_DIR": "/run/user/5", "SLURM_JOB_ID": "77"}) == \
        "/run/user/5/dynamiccl/tuner-77.conf"
    assert rp.job_id({"DYNAMICCL_JOB_ID": "a/b", "SLURM_JOB_ID": "3"}) == "3"
    assert rp.job_id({"DYNAMICCL_JOB_ID": "a b"}) is None


@pytest.fixture(scope="module")
def c_paths(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("paths")
    (d / "main.c").write_text(C_MAIN)
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", "-I", str(HEADER.parent), str(d / "main.c"), "-o",
                    str(d / "paths")], check=True)

    def run(env: dict[str, str]) -> list[str]:
        base = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR",) + rp.JOB_ENV_VARS}
        out = subprocess.run([str(d / "paths")], env={**base, **env}, capture_output=True, text=True, check=True)
        return out.stdout.splitlines()
    return run


@pytest.mark.parametrize("env", CASES, ids=lambda e: ",".join(f"{k}={v[:12]}" for k, v in e.items()) or "none")
def test_c_and_python_agree(c_paths, env):
    assert c_paths(env) == [rp.default_socket(env), rp.default_tuner_config(env)]


def test_private_dir_created_0700_and_unsafe_ones_refused(tmp_path):
    d = tmp_path / "rt"
    rp.ensure_private_dir(str(d))
    assert (d.stat().st_mode & 0o777) == 0o700
    d.chmod(0o770)
    with pytest.raises(rp.UnsafeDirectory, match="writable by group or others"):
        rp.ensure_private_dir(str(d))
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(rp.UnsafeDirectory, match="not a directory"):
        rp.check_private_dir(str(link))
    d.chmod(0o700)
    with pytest.raises(rp.UnsafeDirectory, match="owned by uid"):
        rp.check_private_dir(str(d), uid=os.getuid() + 1)
