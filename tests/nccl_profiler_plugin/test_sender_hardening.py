"""The plugin's sender against a slow resolver, with a per-job token, and without any collector."""
from __future__ import annotations

import os
import socket
import subprocess

import pytest

from test_emulator_stream import make_ops

SLOW_RESOLVER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <string.h>
#include <unistd.h>
/* "slow.localhost" takes 3 s to resolve (a numeric-only lookup of it fails at once, as in libc) */
int getaddrinfo(const char* node, const char* service, const struct addrinfo* hints, struct addrinfo** res) {
  int (*real)(const char*, const char*, const struct addrinfo*, struct addrinfo**) = dlsym(RTLD_NEXT, "getaddrinfo");
  if (node && strcmp(node, "slow.localhost") == 0) {
    if (hints && (hints->ai_flags & AI_NUMERICHOST)) return EAI_NONAME;
    sleep(3);
    node = "127.0.0.1";
  }
  return real(node, service, hints, res);
}
"""


@pytest.fixture(scope="module")
def slow_resolver(tmp_path_factory):
    d = tmp_path_factory.mktemp("resolver")
    (d / "slow.c").write_text(SLOW_RESOLVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(d / "slow.so"), str(d / "slow.c"), "-ldl"], check=True)
    return str(d / "slow.so")


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_finalize_does_not_wait_for_a_slow_resolver(run_scenario, collector_factory, slow_resolver):
    port = _free_port()
    collector_factory(f"tcp:127.0.0.1:{port}")
    res = run_scenario([{"op": "init", "hash": 5}, {"op": "run", "ops": make_ops(20)}, {"op": "sync"},
                        {"op": "finalize"}], f"tcp:slow.localhost:{port}", env={"LD_PRELOAD": slow_resolver})
    assert res["ok"], res
    assert res["finalize_s"] < 0.5, res["finalize_s"]   # before: 3-6 s (getaddrinfo on the join path)
    st = res["stats"]
    assert st["records_sent"] + st["records_undelivered"] == 20  # nothing unaccounted


def test_no_collector_logs_once_and_sums_up_at_finalize(run_scenario, tmp_path):
    res = run_scenario([{"op": "init", "hash": 5}, {"op": "run", "ops": make_ops(30)}, {"op": "sync"},
                        {"op": "sleep", "s": 0.3}, {"op": "run", "ops": make_ops(30, seq0=30)}, {"op": "sync"},
                        {"op": "finalize"}], f"unix:{tmp_path}/nobody.sock", env={"DYNAMICCL_FLUSH_MS": "20"})
    assert res["ok"], res
    err = res["stderr"]
    assert err.count("cannot deliver records to the collector") == 1, err   # before: nothing logged
    assert "finalize: 0 records sent" in err and "60 undelivered" in err, err


def test_token_opens_the_connection_and_the_collector_accepts_it(run_scenario, tmp_path):
    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.pipeline import Pipeline
    tokens = tmp_path / "tokens"
    tokens.write_text("job-test s3cret\n")
    os.chmod(tokens, 0o600)
    addr = f"unix:{tmp_path}/c.sock"
    cfg = default_config().replace(receiver={"listen": (addr,), "tokens_file": str(tokens)},
                                   parquet={"directory": None}, prometheus={"address": None},
                                   features={"address": None}, telemetry={"gpu": False})
    p = Pipeline(cfg).start()
    try:
        steps = [{"op": "init", "hash": 5}, {"op": "run", "ops": make_ops(10)}, {"op": "sync"}, {"op": "finalize"}]
        assert run_scenario(steps, addr, env={"DYNAMICCL_TOKEN": "s3cret"})["ok"]
        assert run_scenario(steps, addr)["ok"]           # no token: refused by the collector
        p.flush(5)
        assert p.metrics.decoded == 10 and p.metrics.refusals["auth"] >= 1
    finally:
        p.shutdown()


def test_default_socket_is_per_user_and_job_and_a_squatted_directory_is_refused(run_scenario, collector_factory,
                                                                                tmp_path):
    """Issue 18 #8: without DYNAMICCL_COLLECTOR the plugin sends to the runtime_paths default
    ($XDG_RUNTIME_DIR/dynamiccl/collector-<job>.sock); a group/other-writable directory is refused, logged once."""
    from dynamiccl.contracts.runtime_paths import default_socket
    env = {"DYNAMICCL_COLLECTOR": "", "XDG_RUNTIME_DIR": str(tmp_path), "DYNAMICCL_JOB_ID": "job-test",
           "DYNAMICCL_FLUSH_MS": "20"}
    path = default_socket(env)
    assert path == f"{tmp_path}/dynamiccl/collector-job-test.sock"
    os.mkdir(tmp_path / "dynamiccl", 0o700)
    coll = collector_factory(f"unix:{path}")
    steps = [{"op": "init", "hash": 5}, {"op": "run", "ops": make_ops(20)}, {"op": "sync"}, {"op": "finalize"}]
    res = run_scenario(steps, "", env=env)
    assert res["ok"] and res["stats"]["records_sent"] == 20, res   # before: sent to /tmp/dynamiccl.sock
    assert coll is not None
    os.chmod(tmp_path / "dynamiccl", 0o777)
    res = run_scenario(steps, "", env=env)
    err = res["stderr"]
    assert res["stats"]["records_sent"] == 0 and res["stats"]["records_undelivered"] == 20, res
    assert err.count("refusing the default collector socket") == 1 and "writable by group or others" in err, err
