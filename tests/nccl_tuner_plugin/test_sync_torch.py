"""The hook in real processes: ``find_plugin()`` finds the library NCCL loaded (by NCCL's names, with
RTLD_NOLOAD); ``agree()`` over torch.distributed (gloo on CPU, 2 processes) leaves both ranks on the same
version whatever each has staged, and a version one rank can no longer provide is applied nowhere."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, format_configs

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, {repo!r})
import torch.distributed as dist
from dynamiccl.nccl_tuner_plugin import sync
from dynamiccl.harness.simulator.tuner_abi import TunerPlugin
rank = int(os.environ["RANK"])
files = json.loads(sys.argv[1])[rank]          # the files this rank sees, one per round
conf = os.environ["CONF"] + f".{{rank}}"
dist.init_process_group("gloo")
p = TunerPlugin({plugin!r})
p.configure(conf, mode="agree", poll_ms=0)
out = []
for text in files:
    with open(conf + ".tmp", "w") as f:
        f.write(text)
    os.replace(conf + ".tmp", conf)
    p.reload()
    out.append([p.staged_version, sync.agree(plugin=p), p.applied_version])
dist.destroy_process_group()
print(json.dumps(out))
"""


def _file(versions) -> str:
    return format_configs([TunerConfig(v, (Rule("AllReduce", 0, 1 << 20, ("RING", "TREE")[v % 2], "LL"),))
                           for v in versions])


@pytest.mark.slow   # two torch processes: ~30 s on the shared 2-core VM (7 s of CPU)
def test_agree_over_torch_distributed(built, tmp_path):
    pytest.importorskip("torch.distributed")
    rounds = [[_file([1, 2, 3]), _file(range(5, 13)), _file(range(6, 14))],      # rank 0, one file per round
              [_file([1, 2]), _file([1, 2, 3, 4]), _file(range(6, 14))]]       # rank 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "CONF": str(tmp_path / "tuner.conf")}
    script = SCRIPT.format(repo=str(REPO), plugin=str(built["plugin"]))
    procs = [subprocess.Popen([sys.executable, "-c", script, json.dumps(rounds)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    r0, r1 = outs
    # round 1: staged 3 and 2 -> both apply 2
    assert r0[0] == [3, 2, 2] and r1[0] == [2, 2, 2]
    # round 2: rank 0 has 5..12, rank 1 has 1..4: MIN = 4 is not on rank 0 -> nobody moves
    assert r0[1] == [12, 2, 2] and r1[1] == [4, 2, 2]
    # round 3: both 6..13 -> 13
    assert r0[2] == [13, 13, 13] and r1[2] == [13, 13, 13]


FIND_SCRIPT = r"""
import ctypes, json, os, sys
sys.path.insert(0, {repo!r})
from dynamiccl.nccl_tuner_plugin import sync
before = sync.find_plugin()                       # NCCL has not loaded it yet: None, nothing loaded by us
lib = ctypes.CDLL({plugin!r}, mode=os.RTLD_NOW)   # what NCCL's dlopen does
lib.dynamiccl_tuner_configure({conf!r}.encode(), 0, 0); lib.dynamiccl_tuner_reload()
found = sync.find_plugin()
print(json.dumps({{"before": before is None, "staged": found.staged_version if found else None}}))
"""


@pytest.mark.parametrize("env_value", ["path", "dynamiccl", "libnccl-tuner-dynamiccl.so"])
def test_find_plugin_locates_the_library_nccl_loaded(built, tmp_path, env_value):
    conf = tmp_path / "t.conf"
    conf.write_text(_file([4, 5]))
    value = str(built["plugin"]) if env_value == "path" else env_value
    env = {**os.environ, "NCCL_TUNER_PLUGIN": value}
    r = subprocess.run([sys.executable, "-c", FIND_SCRIPT.format(repo=str(REPO), plugin=str(built["plugin"]),
                                                                 conf=str(conf))],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"before": True, "staged": 5}
