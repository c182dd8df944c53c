"""A node's tuner file from the bus, without a server (scaleout/tuner_bus.py): what it writes, what it
refuses (counted by reason, the file untouched), and that a reader never sees a partial file."""
from __future__ import annotations

import pytest

from dynamiccl.contracts.tuner_file import MAX_FILE_BYTES
from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, format_configs, parse_configs, read_configs
from dynamiccl.scaleout.tuner_bus import H_JOB, H_VERSION, TunerSink, stored_subject, tuner_headers, tuner_subject


def _file(*versions, proto="LL"):
    return format_configs([TunerConfig(v, (Rule("AllReduce", 0, 65535 + v, "RING", proto, 4),)) for v in versions]).encode()


def _offer(sink, data, job="j", version=None, subject=None):
    v = version if version is not None else parse_configs(data.decode())[-1].version
    return sink.offer(subject or tuner_subject(job), tuner_headers(job, v), data)


def test_newer_versions_are_written_whole_and_repeats_are_not_refusals(tmp_path):
    path = tmp_path / "tuner.conf"
    counters = {}
    sink = TunerSink("j", str(path), counters)
    assert sink.version == 0 and counters["tuner_version"] == 0
    assert _offer(sink, _file(1)) == "written" and path.read_bytes() == _file(1)
    assert _offer(sink, _file(1, 2, 3)) == "written" and path.read_bytes() == _file(1, 2, 3)
    assert _offer(sink, _file(1, 2, 3)) == "current"            # a redelivery: nothing written, nothing refused
    assert counters["tuner_written"] == 2 and counters["tuner_current"] == 1 and counters["tuner_version"] == 3
    assert not any(v for k, v in counters.items() if k.startswith("tuner_refused_"))
    assert [p.name for p in tmp_path.iterdir()] == ["tuner.conf"]   # no temporary file left
    # a restarted node continues from the file it finds
    assert TunerSink("j", str(path), {}).version == 3


@pytest.mark.parametrize("reason, make", [
    ("oversize", lambda: (b"#" * (MAX_FILE_BYTES + 1), {}, None)),
    ("wrong_job", lambda: (_file(5), {"job": "k"}, None)),                       # header names another job
    ("wrong_job", lambda: (_file(5), {"subject": tuner_subject("k")}, None)),    # delivered on another job's subject
    ("malformed", lambda: (b"\xff\xfe garbage", {"version": 5}, None)),
    ("malformed", lambda: (_file(4, 5)[:-20], {"version": 5}, None)),           # cut short: no CRC trailer
    ("malformed", lambda: (_file(5), {"version": 6}, None)),                     # header disagrees with the file
    ("malformed", lambda: (b"version 5\nAllReduce 0 100 RING LL 4 0 *\n", {"version": 5}, None)),  # format 1: no trailer
    ("older_version", lambda: (_file(1, 2), {}, None)),
    ("version_reused", lambda: (_file(2, 3, proto="SIMPLE"), {}, None)),         # version 3 again, other rules
])
def test_bad_payloads_are_refused_counted_and_leave_the_file(tmp_path, reason, make):
    path = tmp_path / "tuner.conf"
    counters = {}
    sink = TunerSink("j", str(path), counters)
    assert _offer(sink, _file(1, 2, 3)) == "written"
    data, how, _ = make()
    job, subject = how.get("job", "j"), how.get("subject")
    headers = tuner_headers(job, how.get("version", 0))
    if "version" not in how:
        headers[H_VERSION] = str(parse_configs(data.decode())[-1].version) if len(data) <= MAX_FILE_BYTES else "9"
    assert sink.offer(subject or tuner_subject("j"), headers, data) == reason
    assert counters[f"tuner_refused_{reason}"] == 1 and counters["tuner_written"] == 1
    assert path.read_bytes() == _file(1, 2, 3) and sink.version == 3 and counters["tuner_version"] == 3


def test_missing_headers_are_refused(tmp_path):
    counters = {}
    sink = TunerSink("j", str(tmp_path / "t.conf"), counters)
    assert sink.offer(tuner_subject("j"), None, _file(1)) == "wrong_job"
    assert sink.offer(tuner_subject("j"), {H_JOB: "j"}, _file(1)) == "malformed"   # no version header
    assert not (tmp_path / "t.conf").exists()


def test_an_unwritable_place_is_counted_and_retried(tmp_path):
    counters = {}
    sink = TunerSink("j", str(tmp_path / "gone" / "t.conf"), counters)
    assert _offer(sink, _file(1)) == "write_failed" and sink.version == 0
    (tmp_path / "gone").mkdir()
    assert _offer(sink, _file(1)) == "written"          # the same version, once it can be written


def test_a_write_that_fails_midway_leaves_the_old_file_whole(tmp_path, monkeypatch):
    """The plugin rereads the file at any moment: a node that dies or fails while writing must leave
    the previous version whole (the new bytes go to a temporary file, fsync'd, then renamed). A
    truncate-and-write in place would leave the new or a cut file here instead."""
    import os
    path = tmp_path / "tuner.conf"
    counters = {}
    sink = TunerSink("j", str(path), counters)
    assert _offer(sink, _file(1)) == "written"

    def fail(_fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(os, "fsync", fail)
    assert _offer(sink, _file(1, 2)) == "write_failed"
    assert path.read_bytes() == _file(1) and sink.version == 1 and counters["tuner_refused_write_failed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["tuner.conf"]      # no temporary file left behind
    monkeypatch.undo()
    assert _offer(sink, _file(1, 2)) == "written" and read_configs(path)[-1].version == 2


def test_the_nodes_metrics_name_each_refusal(tmp_path):
    from prometheus_client import generate_latest

    from dynamiccl.scaleout.bus import Outbox
    from dynamiccl.scaleout.node import NodeCollector, NodeConfig, registry
    node = NodeCollector(NodeConfig("n0", "j"), Outbox(None))
    assert "tuner" not in generate_latest(registry(node)).decode()       # no --tuner-config: no such series
    sink = TunerSink("j", str(tmp_path / "t.conf"), node.counters)
    _offer(sink, _file(2))
    _offer(sink, _file(1))
    _offer(sink, _file(3), job="k")
    text = generate_latest(registry(node)).decode()
    for line in ('dynamiccl_node_tuner_configs_total{outcome="written"} 1.0',
                 'dynamiccl_node_tuner_configs_total{outcome="refused_older_version"} 1.0',
                 'dynamiccl_node_tuner_configs_total{outcome="refused_wrong_job"} 1.0',
                 'dynamiccl_node_tuner_configs_total{outcome="refused_oversize"} 0.0',
                 "dynamiccl_node_tuner_version 2.0"):
        assert line in text, line


def test_the_tuner_file_flag_is_validated_at_start_up(tmp_path, capsys):
    from dynamiccl.cli import main
    assert main(["node", "--node", "n0", "--job", "j", "--tuner-config", str(tmp_path / "absent" / "t.conf")]) == 2
    assert "node.tuner_config" in capsys.readouterr().err
    assert main(["node", "--node", "n0", "--job", "j", "--tuner-config", str(tmp_path / "t.conf"), "--tuner-poll", "0"]) == 2
    assert "node.tuner_poll_s" in capsys.readouterr().err


def test_a_republished_message_names_the_subject_it_was_stored_under():
    h = {"Nats-Subject": "dynamiccl.tuner.j", "Nats-Sequence": "7"}
    assert stored_subject("dynamiccl.tunerlive.j", h) == ("dynamiccl.tuner.j", 7)
    assert stored_subject("dynamiccl.tuner.j", h) == ("dynamiccl.tuner.j", None)   # not a republish: as it came
    assert stored_subject("dynamiccl.tunerlive.j", {}) == ("", None)               # refused as wrong_job then
