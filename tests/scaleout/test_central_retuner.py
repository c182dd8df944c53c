"""A retuner per job on the central tier (``dynamiccl central --retune``): dry run by default; applying
needs an allow-list of jobs, one tuner file per job, and windows whose every input authenticated (each
node's receiver required tokens and the bus refused unknown publishers), as on one machine."""
from __future__ import annotations

import argparse

import pytest

from dynamiccl.cli import main
from dynamiccl.detector.config import AutoencoderConfig, BaselineConfig, DetectorConfig
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.scaleout.bus import Message, msg_id, subject
from dynamiccl.scaleout.central import CentralShard, detector_loop
from dynamiccl.scaleout.merger import MergerConfig, ShardTable
from dynamiccl.scaleout.retuning import CentralRetuning, retuner_factory, retuning_from_args
from dynamiccl.scaleout.wire import encode_partial
from tests.scaleout.helpers import Clock, events, partials

JOBS = {"j": frozenset({"node0", "node1"})}


def _retuning(tmp_path, **kw):
    return CentralRetuning(RetunerConfig(**kw), str(tmp_path / "tuner-{job}.conf"),
                           str(tmp_path / "audit-{job}.jsonl")).validate(JOBS)


def _run(retuning, parts, *, bus_auth, node_auth=("node0", "node1"), detector=None):
    """Every window of ``parts`` through one shard with the retuner of ``retuning``; (shard, retuners)."""
    clock, retuners = Clock(), {}
    det = detector or DetectorConfig(baseline=BaselineConfig(warmup=60), autoencoder=AutoencoderConfig(enabled=False))
    shard = CentralShard("s0", MergerConfig(JOBS), ShardTable(1.5, clock), {},
                         detector_loop(det, make_retuner=retuner_factory(retuning, retuners, clock=lambda: 0.0)),
                         clock, bus_authenticated=bus_auth)
    for w, ps in sorted(parts.items()):
        for p in ps:
            data = encode_partial(p, "j", authenticated=p["node"] in node_auth)
            assert shard.handle(Message(subject("j", p["node"]), data, msg_id("j", p["node"], w))) == "filed"
        shard.poll()
    clock.t += 60.0
    shard.poll()
    for jr in retuners.values():
        jr.close()
    return shard, retuners


@pytest.fixture(scope="module")
def parts():
    return partials(events())


def test_dry_run_by_default_sees_every_window_and_writes_no_tuner_file(tmp_path, parts):
    shard, rts = _run(_retuning(tmp_path), parts, bus_auth=False, node_auth=())
    m = rts["j"].retuner.metrics
    assert shard.counters["windows_run"] == len(parts) >= 3
    assert m.counters["windows"] == len(parts) and m.dry_run == 1 and sum(m.dropped.values()) == 0
    assert not (tmp_path / "tuner-j.conf").exists()


@pytest.mark.parametrize("bus_auth,node_auth,apply_job,dropped", [
    (True, ("node0", "node1"), "j", None),                 # every input authenticated: the windows reach it
    (False, ("node0", "node1"), "j", "unauthenticated"),   # the bus lets anyone publish
    (True, ("node0",), "j", "unauthenticated"),            # node1's ranks present no token
    (True, ("node0", "node1"), "other-*", "not_allowed"),  # not an allow-listed job
])
def test_applying_acts_only_on_allowed_and_authenticated_windows(tmp_path, parts, bus_auth, node_auth, apply_job,
                                                                 dropped):
    shard, rts = _run(_retuning(tmp_path, dry_run=False, jobs=(apply_job,)), parts, bus_auth=bus_auth,
                      node_auth=node_auth)
    m = rts["j"].retuner.metrics
    assert shard.counters["windows_run"] == len(parts)
    if dropped is None:
        assert m.counters["windows"] == len(parts) and sum(m.dropped.values()) == 0
    else:
        assert m.counters["windows"] == 0 and m.dropped[dropped] >= len(parts)     # not_allowed counts rows


def _args(**kw):
    base = dict(retune=False, apply=False, apply_job=None, comm=None, allow=None, deny=None, topology=None,
                retuner_config=None, tuner_config="./runs/tuner-{job}.conf", audit="off", allow_unauthenticated=False)
    return argparse.Namespace(**{**base, **kw})


def test_flags_off_by_default_dry_run_with_retune_and_refused_when_unsafe(tmp_path, capsys):
    assert retuning_from_args(_args(), JOBS) is None
    r = retuning_from_args(_args(retune=True), JOBS)
    assert r.base.dry_run and r.audit is None and r.for_job("j").tuner_config_path == "./runs/tuner-j.conf"
    two = ["--job", "a=n0", "--job", "b=n1"]
    cases = [(["--apply"], "--apply-job"),
             (["--apply", "--apply-job", "*", "--tuner-config", str(tmp_path / "one.conf")], "{job}"),
             (["--apply", "--apply-job", "*", "--tuner-config", str(tmp_path / "no" / "{job}.conf")], "does not exist"),
             (["--retune", "--tuner-config", str(tmp_path / "{jbo}.conf")], "only {job}"),
             (["--retune", "--deny", "NOPE/LL"], "deny[0]")]
    for flags, says in cases:
        assert main(["central", "--shard", "s0", *two, *flags]) == 2, flags
        assert says in capsys.readouterr().err, flags


@pytest.mark.slow
def test_central_retuner_decides_as_the_single_machine_retuner(tmp_path):
    """The drop-then-straggler scenario: the shard's retuner (dry run) gets every window and change the
    single machine's gets, and its audit log records the same decisions (a measured ratio is a ratio of two
    quantiles of the merged windows' histograms, each within one 2^(1/8) bucket of the exact value, so the
    two ratios agree within 2^(2/8))."""
    import json

    from dynamiccl.collector.component import FuncConsumer, RecordBatch
    from dynamiccl.collector.config import WindowConfig
    from dynamiccl.collector.processors.window_agg import WindowAggregator
    from dynamiccl.loop import Loop
    from dynamiccl.retuner.agent import Retuner
    from tests.scaleout.helpers import PER_NODE
    from tests.scaleout.test_shard_loop import NRANKS, _config, _scenario

    ev = _scenario()
    single = Retuner(RetunerConfig(audit_path=str(tmp_path / "single.jsonl")), clock=lambda: 0.0)
    loop = Loop(detector_loop(_config())("j").detector, single)
    agg = WindowAggregator(WindowConfig(window_s=1.0), next_consumer=FuncConsumer(lambda r: loop.step(r.features)))
    for n in range(NRANKS // PER_NODE):
        agg.consume(RecordBatch(ev[ev["rank"] // PER_NODE == n], host=f"node{n}", job_id="j"))
    agg.shutdown()
    single.close()
    shard, rts = _run(_retuning(tmp_path), partials(ev), bus_auth=False, node_auth=(), detector=_config())
    central = rts["j"].retuner.metrics.counters
    assert central["changes"] == single.metrics.counters["changes"] >= 2
    assert central["windows"] == shard.counters["windows_run"] >= single.metrics.counters["windows"] - 1

    def audit(path):
        return [json.loads(line) for line in path.read_text().splitlines()]
    ours, theirs = audit(tmp_path / "audit-j.jsonl"), audit(tmp_path / "single.jsonl")
    assert len(ours) == len(theirs) >= 3
    for a, b in zip(ours, theirs):           # the same decision, target, regime, candidates and time;
        # ratios from approximate latencies: a recommendation's measured ratio, an ignored change's magnitude
        for k in ("measured_ratio", "magnitude"):
            ra, rb = a.pop(k, None), b.pop(k, None)
            assert (ra is None) == (rb is None) and (ra is None or 2 ** (-2 / 8) <= ra / rb <= 2 ** (2 / 8)), k
        assert a == b
