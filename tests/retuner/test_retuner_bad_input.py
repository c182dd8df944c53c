"""Bad input never stops the retuner or the job: malformed events/windows/observations are counted, a failed
or interrupted write leaves the last good tuner config in place, a malformed existing file is reported."""
from __future__ import annotations

import math
import os
import stat

import pytest

import dynamiccl.nccl_tuner_plugin.config as tc
from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, read_configs, write_configs
from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig, from_dict
from dynamiccl.retuner.evaluation.sim_tuner import FileTuner
from dynamiccl.retuner.types import Observation

from retuner_fakejob import FakeJob, rc, simple_cost, target


def make(tmp_path, **kw) -> Retuner:
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"), audit_path=None,
                        policy=PolicyConfig(tune_at_start=False), **kw)
    return Retuner(cfg, clock=lambda: 0.0)


def test_malformed_inputs_are_counted_not_raised(tmp_path):
    rt = make(tmp_path)
    assert rt.on_change("not json") is None
    assert rt.on_change('{"v": 1, "kind": "weather"}') is None
    assert rt.on_window(object()) is None
    bad = [Observation(target(), 0.0, 1.0, 10, math.nan), Observation(target(), 0.0, 1.0, 0, 1e-3),
           Observation(target(), 1.0, 0.5, 10, 1e-3), "not an observation"]
    rt.observe(bad)
    assert rt.metrics.dropped["malformed"] == 7
    assert rt.metrics.counters["changes"] == 2 and rt.metrics.counters["windows"] == 1


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"policy.alpha must be in \(0, 0.5\]"):
        RetunerConfig(policy=PolicyConfig(alpha=0.0)).validate()
    with pytest.raises(ValueError, match="unknown key"):
        from_dict({"dry_run": False, "polcy": {}})
    with pytest.raises(ValueError, match=r"policy: unknown key\(s\) \['min_gian'\]"):
        from_dict({"policy": {"min_gian": 0.1}})
    with pytest.raises(ValueError, match="topology"):
        from_dict({"topology": "no-such-cluster"})
    with pytest.raises(ValueError, match="does not exist"):
        RetunerConfig(dry_run=False, tuner_config_path="/no/such/dir/t.conf").validate()
    with pytest.raises(ValueError, match=r"pins\[0\]"):
        from_dict({"pins": [{"func": "AllReduce", "algo": "RING", "proto": "LL9"}]})
    cfg = from_dict({"allow": ["RING/*", "TREE/LL128"], "deny": ["*/*/1"]})
    assert cfg.permitted("RING", "SIMPLE", 8) and cfg.permitted("TREE", "LL128")
    assert not cfg.permitted("TREE", "SIMPLE") and not cfg.permitted("RING", "LL", 1)


def test_failed_push_keeps_the_last_good_file_and_is_visible(tmp_path):
    d = tmp_path / "cfg"
    d.mkdir()
    rt = Retuner(RetunerConfig(dry_run=False, tuner_config_path=str(d / "tuner.conf"), audit_path=None,
                               policy=PolicyConfig(tune_at_start=False)), clock=lambda: 0.0)
    job = FakeJob(str(d / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    for _ in range(3):
        rt.observe(job.step())
    job.regime = "slow"
    rt.on_change(rc("rc-1", "latency", job.t))
    rt.observe(job.step())
    rt.observe(job.step())
    good = (d / "tuner.conf").read_text()
    version = rt.pusher.version
    os.chmod(d, stat.S_IRUSR | stat.S_IXUSR)          # the directory becomes read-only
    try:
        if os.access(d, os.W_OK):
            pytest.skip("running as a user that ignores directory permissions")
        for _ in range(6):
            rt.observe(job.step())
    finally:
        os.chmod(d, stat.S_IRWXU)
    assert (d / "tuner.conf").read_text() == good and rt.pusher.version == version
    assert rt.metrics.push_errors["write_failed"] >= 1
    assert any(a["action"] == "push_error" for a in rt.audit.recent)
    for _ in range(3):                                   # writable again: the pending config goes out
        rt.observe(job.step())
    assert rt.pusher.version > version


def test_push_error_when_root_ignores_permissions(tmp_path, monkeypatch):
    """Same property with the write failing inside write_configs (works as root too)."""
    rt = make(tmp_path)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({"slow": ("TREE", "LL128", 0)}))
    for _ in range(3):
        rt.observe(job.step())
    job.regime = "slow"
    rt.on_change(rc("rc-1", "latency", job.t))
    rt.observe(job.step())
    good = (tmp_path / "tuner.conf").read_text()

    def disk_full(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("dynamiccl.retuner.push.write_configs", disk_full)
    for _ in range(4):
        rt.observe(job.step())
    assert (tmp_path / "tuner.conf").read_text() == good
    assert rt.metrics.push_errors["write_failed"] >= 1
    monkeypatch.undo()
    rt.observe(job.step())
    assert (tmp_path / "tuner.conf").read_text() != good


def test_dying_mid_push_leaves_the_old_file_and_a_restart_continues(tmp_path, monkeypatch):
    path = tmp_path / "tuner.conf"
    write_configs(path, [TunerConfig(5, (Rule("AllReduce", 0, 100, "RING", "LL", 2),))])
    before = path.read_text()

    def killed(*a, **k):                       # the process dies between writing the temp file and the rename
        raise SystemExit("killed")
    monkeypatch.setattr(tc.os, "replace", killed)
    with pytest.raises(SystemExit):
        write_configs(path, [TunerConfig(6, ())])
    monkeypatch.undo()
    assert path.read_text() == before and sorted(os.listdir(tmp_path)) == ["tuner.conf"]
    rt = make(tmp_path)
    assert rt.pusher.version == 5                # continues the version series
    assert rt.pusher.push([]) == 6 and [c.version for c in read_configs(path)] == [5, 6]


def test_malformed_existing_file_is_reported_and_superseded(tmp_path):
    path = tmp_path / "tuner.conf"
    path.write_text("version banana\n")
    rt = make(tmp_path)
    assert rt.pusher.load_error and rt.metrics.push_errors["invalid_config"] == 1
    assert any(a["action"] == "error" for a in rt.audit.recent)
    v = rt.pusher.push([])
    assert v is not None and v > 0
    # the job side: a reader that holds a good config keeps it when the file turns bad
    write_configs(path, [TunerConfig(v + 1, (Rule("AllReduce", 0, 100, "RING", "LL", 2),))])
    ft = FileTuner(path)
    assert ft.refresh() == v + 1
    path.write_text("version 99\nAllReduce 0 oops RING LL 2 0 *\n")
    assert ft.refresh() == v + 1 and ft.errors == 1


def test_unknown_targets_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr("dynamiccl.retuner.agent.MAX_TARGETS", 4)
    rt = make(tmp_path)
    rt.observe([Observation(target(h), 0.0, 1.0, 10, 1e-3) for h in range(1, 10)])
    assert len(rt.targets) == 4 and rt.metrics.dropped["unknown_target"] == 5
