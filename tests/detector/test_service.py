"""The detector service over real sockets: feature stream in (with a collector restart),
regime changes out over TCP, /metrics, a malformed line, an unreachable Grafana."""
from __future__ import annotations

import io
import socket
import threading
import time
import urllib.request

import pytest

from dynamiccl.collector.features import encode_line
from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.events import RegimeChange
from dynamiccl.detector.runner import DetectorService, ServiceConfig
from dynamiccl.detector.server import ChangeServer, subscribe_changes
from dynamiccl.harness.detector_testing import SyntheticJob, bandwidth_regime


class FakeCollector:
    """Serves NDJSON feature lines to whoever connects (like the collector's feature server)."""

    def __init__(self, port: int = 0):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def wait_client(self, timeout=10.0):
        end = time.monotonic() + timeout
        while not self.conns and time.monotonic() < end:
            time.sleep(0.02)
        assert self.conns, "the detector did not connect"

    def send(self, data: bytes):
        for c in list(self.conns):
            c.sendall(data)

    def close(self):
        for c in self.conns:
            c.close()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)      # wakes the accept() thread
        except OSError:
            pass
        self.sock.close()
        self._t.join(timeout=5)


def _wait(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_service_end_to_end_over_tcp():
    col = FakeCollector()
    out = io.StringIO()
    cfg = ServiceConfig(features=f"tcp:127.0.0.1:{col.port}", metrics="127.0.0.1:0", serve="tcp:127.0.0.1:0",
                        reconnect_min_s=0.05, reconnect_max_s=0.2)
    svc = DetectorService(cfg, DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)), out=out).start()
    try:
        col.wait_client()
        job = SyntheticJob(seed=1)
        got: list[RegimeChange] = []
        client = subscribe_changes(svc.addresses["serve"], timeout=20)
        reader = threading.Thread(target=lambda: got.extend(client), daemon=True)
        reader.start()
        assert _wait(lambda: svc.server.n_clients == 1)
        col.send(b"{not json\n")                                   # malformed: counted, skipped
        for t in range(80):
            col.send(encode_line(job.window(t)))
        assert _wait(lambda: svc.detector.windows == 80)
        # the collector restarts: the detector reconnects and carries on
        port = col.port
        col.close()
        col = FakeCollector(port)
        col.wait_client()
        reg = bandwidth_regime(job, 1.8)
        for t in range(80, 100):
            col.send(encode_line(job.window(t, reg)))
        assert _wait(lambda: len(got) >= 1)
        assert got[0].kind == "bandwidth"
        m = svc.metrics
        assert m.value("dynamiccl_detector_windows_dropped_total", reason="malformed") == 1
        assert m.value("dynamiccl_detector_feature_stream_reconnects_total") >= 1
        assert m.value("dynamiccl_detector_changes_emitted_total") >= 1
        # each change is also one JSON line in the log output
        first = out.getvalue().splitlines()[0]
        assert RegimeChange.from_json(first).id == got[0].id
        body = urllib.request.urlopen(f"http://{svc.addresses['metrics']}/metrics", timeout=5).read().decode()
        for name in ("dynamiccl_detector_windows_received_total", "dynamiccl_detector_regime_active{",
                     "dynamiccl_detector_cusum_statistic{", "dynamiccl_detector_detection_delay_seconds_bucket"):
            assert name in body
        # a late subscriber first gets the active change
        late = subscribe_changes(svc.addresses["serve"], timeout=10)
        assert next(late).id == got[0].id
    finally:
        svc.shutdown()
        col.close()


def test_slow_client_drops_are_counted_not_blocking():
    drops = []
    srv = ChangeServer("tcp:127.0.0.1:0", max_queue=4, on_drop=lambda: drops.append(1)).start()
    try:
        s = socket.create_connection(("127.0.0.1", int(srv.address.rsplit(":", 1)[1])))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        assert _wait(lambda: srv.n_clients == 1)
        big = RegimeChange(id="rc-j-1", kind="bandwidth", job_id="j", start_s=0.0, detected_s=1.0, magnitude=2.0,
                           evidence={"pad": "x" * 100_000})
        t0 = time.monotonic()
        for _ in range(200):
            srv.publish(big)                      # the client never reads
        assert time.monotonic() - t0 < 10.0       # publishing never blocks (a blocked publish waits forever)
        assert _wait(lambda: len(drops) > 0)
        s.close()
    finally:
        srv.shutdown()


def test_an_oversized_line_is_counted_and_the_stream_goes_on():
    """The shared line reader (dynamiccl.contracts.lines) discards a line over max_line_bytes up to its newline;
    the windows after it on the same connection are processed, none waits for a reconnect."""
    col = FakeCollector()
    cfg = ServiceConfig(features=f"tcp:127.0.0.1:{col.port}", metrics=None, serve=None, max_line_bytes=16384,
                        reconnect_min_s=60.0, reconnect_max_s=60.0)   # a reconnect would stall the test
    svc = DetectorService(cfg, DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)), out=io.StringIO()).start()
    try:
        col.wait_client()
        job = SyntheticJob(seed=3)
        col.send(encode_line(job.window(0)))
        col.send(b"x" * 40_000)                       # over the limit before its newline arrives
        m = svc.metrics
        assert _wait(lambda: m.value("dynamiccl_detector_windows_dropped_total", reason="malformed") == 1)
        col.send(b"the rest of it\n" + b"".join(encode_line(job.window(t)) for t in range(1, 5)))
        assert _wait(lambda: svc.detector.windows == 5, timeout=10)
        assert m.value("dynamiccl_detector_windows_dropped_total", reason="malformed") == 1
        assert m.value("dynamiccl_detector_feature_stream_reconnects_total") == 0
    finally:
        svc.shutdown()
        col.close()


def test_unreachable_grafana_is_one_log_line_and_a_counter(caplog):
    from dynamiccl.detector.cli import annotation_sink
    col = FakeCollector()
    with socket.socket() as s:                    # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    cfg = ServiceConfig(features=f"tcp:127.0.0.1:{col.port}", metrics=None, serve=None)
    annotate = annotation_sink(f"http://127.0.0.1:{dead}", "glsa_test")   # what `detector run --grafana-url` builds
    svc = DetectorService(cfg, DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)), out=io.StringIO(),
                          annotate=annotate).start()
    try:
        col.wait_client()
        job = SyntheticJob(seed=2)
        reg = bandwidth_regime(job, 1.8)
        for t in range(120):
            col.send(encode_line(job.window(t, reg if 80 <= t < 100 else None)))
        assert _wait(lambda: svc.metrics.value("dynamiccl_detector_grafana_annotations_total", result="error") >= 2)
        assert _wait(lambda: svc.detector.windows == 120)   # the pipeline kept going
        warnings = [r for r in caplog.records if "Grafana" in r.getMessage() and r.levelname == "WARNING"]
        assert len(warnings) == 1
    finally:
        svc.shutdown()
        col.close()


def test_service_config_errors_are_clear():
    with pytest.raises(ValueError, match="--features"):
        ServiceConfig(features="nonsense").validate()
    from dynamiccl.detector.cli import annotation_sink
    with pytest.raises(ValueError, match="--grafana-token needs"):
        annotation_sink(None, "x")
    with pytest.raises(ValueError, match="--grafana-url: expected"):
        annotation_sink("grafana:3000", None)
    assert annotation_sink(None, None) is None


def test_in_process_service_without_a_feature_stream():
    """What `dynamiccl demo` does: feed windows itself, serve the change stream."""
    cfg = ServiceConfig(features=None, metrics=None, serve="tcp:127.0.0.1:0")
    svc = DetectorService(cfg, DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)), out=io.StringIO()).start()
    try:
        client = subscribe_changes(svc.addresses["serve"], timeout=20)
        assert _wait(lambda: svc.server.n_clients == 1)
        job = SyntheticJob(seed=3)
        reg = bandwidth_regime(job, 1.8)
        emitted = []
        for t in range(100):
            emitted += svc.process_window(job.window(t, reg if t >= 80 else None))
        assert [c.kind for c in emitted] == ["bandwidth"]
        assert next(client).id == emitted[0].id
    finally:
        svc.shutdown()
