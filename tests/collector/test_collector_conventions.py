"""The collector's exporter conventions: plugin connections per job (what NcclJobStalled needs on a collector
shared by several jobs), process metrics without ``_created`` series, and the plugin socket's mode."""
from __future__ import annotations

import os
import stat
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dynamiccl.collector.pipeline import Pipeline
from dynamiccl.harness.collector_testing import encode_frame, process_record
from dynamiccl.collector.wire_format import EVENT_DTYPE

from collector_helpers import connect, quiet_config, sock_path, wait_until  # noqa: F401 (fixtures)


def _hello(job, host, pid):
    return encode_frame(process_record(host, job, pid, start_ns=1).view(EVENT_DTYPE))


@pytest.fixture
def served(quiet_config, sock_path):
    """A collector with a plugin socket and /metrics on an ephemeral port."""
    with Pipeline(quiet_config.replace(receiver={"listen": (f"unix:{sock_path}",)},
                                       prometheus={"address": "127.0.0.1:0"})) as p:
        yield p


def _scrape(p) -> str:
    url = f"http://{p.addresses['metrics']}/metrics"
    return urllib.request.urlopen(url, timeout=5).read().decode()


def _job_connections(p) -> dict[tuple[str, str], float]:
    fams = {f.name: f for f in text_string_to_metric_families(_scrape(p))}
    return {(s.labels["job_id"], s.labels["host"]): s.value
            for s in fams["dynamiccl_plugin_connections_open"].samples}


def test_connections_are_counted_per_job_and_leave_when_the_job_ends(served):
    addr = served.addresses["listen"][0]
    a1, a2, b = connect(addr), connect(addr), connect(addr)
    a1.sendall(_hello("jobA", "n1", 10))
    a2.sendall(_hello("jobA", "n1", 11))
    b.sendall(_hello("jobB", "n1", 20))
    assert wait_until(lambda: _job_connections(served) == {("jobA", "n1"): 2, ("jobB", "n1"): 1})
    anonymous = connect(addr)            # no PROCESS record yet: in connections_open, in no job
    assert wait_until(lambda: served.metrics.connections_open == 4)
    assert _job_connections(served) == {("jobA", "n1"): 2, ("jobB", "n1"): 1}
    a1.close()
    a2.close()                           # jobA ended; jobB still runs on this shared collector
    assert wait_until(lambda: _job_connections(served) == {("jobB", "n1"): 1})
    b.close()
    anonymous.close()
    assert wait_until(lambda: served.metrics.connections_open == 0)
    assert _job_connections(served) == {}
    assert served.metrics.job_connections == {}


def test_process_metrics_and_no_created_series(served):
    text = _scrape(served)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"} <= names
    assert "_created" not in text


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_plugin_socket_is_group_rw_whatever_the_umask(quiet_config, sock_path, umask):
    old = os.umask(umask)
    try:
        p = Pipeline(quiet_config.replace(receiver={"listen": (f"unix:{sock_path}",)})).start()
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o660
    finally:
        p.shutdown()
