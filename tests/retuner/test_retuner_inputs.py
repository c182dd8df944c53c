"""The retuner service acts only on allow-listed jobs and on windows from authenticating collectors."""
from __future__ import annotations

import time

import pytest

from dynamiccl.collector.features import encode_line
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
from retuner_fakejob import rc
from test_retuner_stream import _Server, _wait, window


def _service(tmp_path, features, changes, **kw):
    from dynamiccl.retuner.service import RetunerService
    cfg = RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "t.conf"), audit_path=None,
                        policy=PolicyConfig(tune_at_start=False), metrics=None,
                        changes=f"tcp:127.0.0.1:{changes.port}", features=f"tcp:127.0.0.1:{features.port}", **kw)
    return RetunerService(cfg).start()


def _authed(t0, **row):
    wf = window(t0, [row])
    wf.counters["inputs_authenticated"] = 1
    return wf


def _feed(svc, features, changes, windows, change):
    features.send(b"".join(encode_line(w) for w in windows))
    assert _wait(lambda: svc.retuner.metrics.counters["windows"] + sum(svc.retuner.metrics.dropped.values()) >= 1)
    changes.send(change.to_json().encode() + b"\n")
    time.sleep(0.5)  # nothing to wait for when the change is (rightly) dropped


def test_apply_without_a_job_allow_list_is_refused_at_start(tmp_path):
    from dynamiccl.retuner.service import RetunerService
    with pytest.raises(ValueError, match="--job"):
        RetunerService(RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "t.conf"), metrics=None))


@pytest.mark.parametrize("case", ["forged_unauthenticated", "job_not_allowed", "allowed"])
def test_forged_stream_cannot_make_the_retuner_write(tmp_path, case):
    features, changes = _Server(), _Server()
    jobs = ("other-*",) if case == "job_not_allowed" else ("job",)
    svc = _service(tmp_path, features, changes, jobs=jobs)
    try:
        windows = [window(float(i), [{}]) if case == "forged_unauthenticated" else _authed(float(i))
                   for i in range(5)]
        _feed(svc, features, changes, windows, rc("rc-1", "latency", 5.0))
        # a refusal is shown by waiting as long as an allowed write takes (~2 s); an allowed write may take longer under load
        written = _wait(lambda: (tmp_path / "t.conf").exists(), timeout=20.0 if case == "allowed" else 3.0)
        dropped = svc.retuner.metrics.dropped
        if case == "allowed":
            assert written
        else:   # before: the forged stream made --apply write a rule within ~2 s
            assert not written
            assert dropped["unauthenticated" if case == "forged_unauthenticated" else "not_allowed"] >= 5
    finally:
        svc.stop()
        features.close()
        changes.close()
