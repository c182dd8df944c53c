"""CLI as a subprocess, config validation, component lifecycles, README vs code."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dynamiccl.contracts.runtime_paths import default_socket
from dynamiccl.collector.config import CollectorConfig, ReceiverConfig, WindowConfig, default_config, flatten
from dynamiccl.collector.metrics import METRICS
from dynamiccl.harness.collector_testing import encode_frame, encode_frames, process_record, synthetic_events

from collector_helpers import quiet_config  # noqa: F401,E402 (fixture)

ROOT = Path(__file__).resolve().parents[2]


def _start(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "dynamiccl", "collector", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_cli_runs_receives_and_flushes_parquet_on_sigterm(tmp_path):
    sock = os.path.join(tempfile.mkdtemp(prefix="dcli"), "c.sock")
    proc = _start("--listen", f"unix:{sock}", "--metrics", "127.0.0.1:0", "--features", "off",
                  "--parquet", str(tmp_path / "pq"), "--window", "0.5")
    try:
        ready = proc.stdout.readline()
        assert ready.startswith("collector ready:"), ready + proc.stderr.read()
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        ev = synthetic_events(100, nranks=1)
        s.sendall(encode_frame(process_record("h", "j", 1000)) + encode_frames(ev))
        s.close()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "received=101 decoded=100" in out
    assert list((tmp_path / "pq").rglob("*.parquet"))
    assert not os.path.exists(sock)


@pytest.mark.parametrize("args,msg", [
    (["--listen", "tcp:nohostport"], "listen: expected HOST:PORT"),
    (["--listen", "udp:1.2.3.4:5"], "expected unix:PATH or tcp:HOST:PORT"),
    (["--window", "0"], "window_s must be > 0"),
])
def test_cli_bad_arguments_exit_nonzero_with_a_clear_line(args, msg):
    proc = _start(*args, "--metrics", "off", "--features", "off", "--parquet", "off")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and msg in err


def test_cli_port_in_use(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    proc = _start("--listen", "off", "--metrics", f"127.0.0.1:{port}", "--features", "off",
                  "--parquet", "off")
    out, err = proc.communicate(timeout=30)
    busy.close()
    assert proc.returncode == 1 and "Address already in use" in err and str(port) in err


def test_validate_names_the_key():
    with pytest.raises(ValueError, match="window_s must be > 0"):
        WindowConfig(window_s=-1).validate()
    with pytest.raises(ValueError, match="allowed_lateness_s"):
        WindowConfig(allowed_lateness_s=-1).validate()
    with pytest.raises(ValueError, match="listen"):
        ReceiverConfig(listen=("bogus",)).validate()
    with pytest.raises(ValueError, match="metrics"):
        default_config().replace(prometheus={"address": "nope"}).validate()
    assert isinstance(default_config().validate(), CollectorConfig)


def test_components_shutdown_without_start_and_twice(quiet_config, tmp_path):
    from dynamiccl.collector.pipeline import Pipeline
    cfg = quiet_config.replace(parquet={"directory": str(tmp_path)})
    p = Pipeline(cfg)
    for comp in (p.prometheus, p.features, p.parquet, p.aggregator, *p.queues.values()):
        comp.shutdown()
        comp.shutdown()
    p.shutdown()
    p.shutdown()
    p2 = Pipeline(cfg).start()
    p2.start()
    p2.shutdown()
    p2.shutdown()


def _readme():
    return (ROOT / "dynamiccl" / "collector" / "README.md").read_text()


RULE_LISTEN = "('unix:$XDG_RUNTIME_DIR/dynamiccl/collector[-JOB].sock',)"


def test_readme_config_table_matches_defaults():
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([^`]*)` \|", _readme(), flags=re.M)
    table = dict(rows)
    defaults = flatten(default_config())
    assert set(table) == set(defaults)
    for key, value in defaults.items():
        if key == "receiver.listen":  # per user and job (contracts/runtime_paths.py): the README states the rule
            assert value == (f"unix:{default_socket()}",) and table[key] == RULE_LISTEN, key
            continue
        assert table[key] == repr(value), key


def test_readme_lists_every_metric():
    text = _readme()
    listed = set(re.findall(r"^\| `(dynamiccl_[a-z_]+)` \|", text, flags=re.M))
    assert listed == {m.name for m in METRICS}
