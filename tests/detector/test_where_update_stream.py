"""A refreshed `where` verdict reaches the change stream's users as its own line (`WhereUpdate.to_json`):
the detector service writes and serves it, `subscribe_changes` skips it unless asked, the retuner counts
and ignores it (never a new change)."""
from __future__ import annotations

import io
import time

import pytest

from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig
from dynamiccl.detector.events import RegimeChange
from dynamiccl.detector.runner import DetectorService, ServiceConfig
from dynamiccl.detector.server import ChangeServer, subscribe_changes
from dynamiccl.detector.where_refresh import WhereUpdate, is_where_update

UPD = WhereUpdate(id="rc-j-1", job_id="j", detected_s=12.0, where={"kind": "rank", "rank": 3, "confidence": 0.8})
RC = RegimeChange(id="rc-j-1", kind="bandwidth", job_id="j", start_s=9.0, detected_s=11.0, magnitude=2.0)


def _wait(pred, timeout=10.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_update_line_round_trips_and_is_told_from_a_change_line():
    line = UPD.to_json()
    assert is_where_update(line) and is_where_update(line.encode()) and not is_where_update(RC.to_json())
    assert WhereUpdate.from_json(line) == UPD
    with pytest.raises(ValueError):             # an update line is never a RegimeChange line
        RegimeChange.from_json(line)


@pytest.mark.parametrize("bad, what", [('{"where_update": 1}', "where_update"),
                                       ('{"where_update": "x", "where": 3, "detected_s": 1}', "where"),
                                       ('{"where_update": "x", "where": {}}', "detected_s")])
def test_malformed_update_lines_name_what_is_wrong(bad, what):
    with pytest.raises(ValueError, match=what):
        WhereUpdate.from_json(bad)


class _Det:
    """Stands in for the detector: no change this window, one where update."""
    def __init__(self, inner):
        self.metrics, self.active, self.ended, self.where_updates = inner.metrics, [], [], [UPD]

    def process(self, wf):
        return []


def test_service_writes_counts_and_serves_the_update():
    out = io.StringIO()
    cfg = ServiceConfig(features=None, metrics=None, serve="tcp:127.0.0.1:0")
    svc = DetectorService(cfg, DetectorConfig(autoencoder=AutoencoderConfig(enabled=False)), out=out).start()
    try:
        svc.detector = _Det(svc.detector)
        plain = subscribe_changes(svc.addresses["serve"], timeout=10)
        both = subscribe_changes(svc.addresses["serve"], timeout=10, where_updates=True)
        assert _wait(lambda: svc.server.n_clients == 2)
        svc.process_window(None)
        svc.server.publish(RC)                  # a change after the update: the plain client's next item
        assert out.getvalue().splitlines() == [UPD.to_json()]
        assert svc.metrics.by_name["dynamiccl_detector_where_updates_emitted_total"]._value.get() == 1
        assert next(plain).id == RC.id          # the update line was skipped, not taken for a change
        got = [next(both), next(both)]
        assert got[0] == UPD and isinstance(got[1], RegimeChange)
        svc.detector.active = [RC]              # a client connecting now gets the change with its newest where
        late = subscribe_changes(svc.addresses["serve"], timeout=10)
        assert next(late).evidence["where"] == UPD.where
    finally:
        svc.shutdown()


def test_change_server_publishes_update_lines_to_clients():
    srv = ChangeServer("tcp:127.0.0.1:0").start()
    try:
        client = subscribe_changes(srv.address, timeout=10, where_updates=True)
        assert _wait(lambda: srv.n_clients == 1)
        srv.publish(RC)
        first = next(client)
        srv.publish_update(UPD)
        assert first.id == RC.id and next(client) == UPD
    finally:
        srv.shutdown()


def test_retuner_counts_and_ignores_an_update(tmp_path):
    from dynamiccl.retuner.agent import Retuner
    from dynamiccl.retuner.config import RetunerConfig
    rt = Retuner(RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "t.conf"), audit_path=None))
    assert rt.on_change(UPD.to_json()) is None
    assert rt.metrics.counters["where_updates"] == 1 and rt.metrics.counters["changes"] == 0
    assert rt.metrics.dropped.get("malformed", 0) == 0
    assert not (tmp_path / "t.conf").exists()   # nothing pushed


def test_report_reads_update_lines_as_the_change_s_newest_where(tmp_path):
    from dynamiccl.report.sidecars import load_sidecars
    (tmp_path / "changes.jsonl").write_text(RC.to_json() + "\n" + UPD.to_json() + "\n")
    side = load_sidecars(tmp_path, changes=str(tmp_path / "changes.jsonl"))
    assert side.problems == []                              # not a malformed line
    (c,) = side.changes
    assert c.id == RC.id and c.evidence["where"] == UPD.where
