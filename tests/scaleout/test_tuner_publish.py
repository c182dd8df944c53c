"""The central side of the tuner files on the bus, without a server (scaleout/tuner_publish.py): each
applied version published once (a failed one retried), a shard taking a job over continues the job's
version numbers from the bus's file, and a shard behind the bus publishes nothing."""
from __future__ import annotations

import asyncio

from dynamiccl.nccl_tuner_plugin.config import Rule, TunerConfig, format_configs, read_configs
from dynamiccl.retuner.config import RetunerConfig
from dynamiccl.retuner.push import ConfigPusher
from dynamiccl.scaleout.retuning import CentralRetuning, retuner_factory
from dynamiccl.scaleout.tuner_bus import H_VERSION, tuner_headers, tuner_subject
from dynamiccl.scaleout.tuner_publish import TunerMirror, TunerPublisher

RULE = Rule("AllReduce", 0, 65535, "RING", "LL", 4)


class FakeJS:
    def __init__(self, fail: int = 0):
        self.sent, self.fail = [], fail

    async def publish(self, subject, data, timeout=None, headers=None):
        if self.fail:
            self.fail -= 1
            raise TimeoutError("no responders")
        self.sent.append((subject, headers, data))


def _bus_file(*versions, proto="LL"):
    return format_configs([TunerConfig(v, (Rule("AllReduce", 0, 100 + v, "RING", proto, 4),)) for v in versions]).encode()


def test_each_version_is_published_once_and_a_failed_one_again(tmp_path):
    pusher = ConfigPusher(tmp_path / "c.conf", dry_run=False)
    js, counters = FakeJS(fail=1), {}
    pub = TunerPublisher(js, counters, TunerMirror(["j"], counters))
    run = lambda: asyncio.run(pub.publish_due({"j": pusher}))   # noqa: E731
    assert run() == 0                                 # nothing applied yet
    pusher.push([RULE])
    assert run() == 0 and counters["tuner_publish_errors"] == 1     # bus down: counted, kept
    assert run() == 1 and run() == 0                  # retried once, then nothing new
    pusher.push([])
    assert run() == 1
    assert [(s, h[H_VERSION]) for s, h, _ in js.sent] == [(tuner_subject("j"), "1"), (tuner_subject("j"), "2")]
    assert js.sent[-1][2] == (tmp_path / "c.conf").read_bytes()     # exactly the file the retuner wrote
    assert counters["tuner_published"] == 2
    dry = ConfigPusher(tmp_path / "d.conf", dry_run=True)
    assert asyncio.run(TunerPublisher(FakeJS(), {}).publish_due({"j": dry})) == 0


def test_a_shard_behind_the_bus_publishes_nothing(tmp_path):
    counters = {}
    mirror = TunerMirror(["j"], counters)
    assert mirror.offer(tuner_subject("j"), tuner_headers("j", 5), _bus_file(4, 5))     # another shard's version 5
    pusher = ConfigPusher(tmp_path / "c.conf", dry_run=False)
    pusher.push([RULE])
    js = FakeJS()
    assert asyncio.run(TunerPublisher(js, counters, mirror).publish_due({"j": pusher})) == 0
    assert js.sent == [] and counters["tuner_publish_stale"] == 1


def test_the_mirror_keeps_the_newest_valid_file_of_its_jobs_only():
    counters = {}
    m = TunerMirror(["j"], counters)
    assert m.offer(tuner_subject("j"), tuner_headers("j", 3), _bus_file(2, 3))
    assert not m.offer(tuner_subject("j"), tuner_headers("j", 2), _bus_file(2))        # older
    assert not m.offer(tuner_subject("k"), tuner_headers("k", 9), _bus_file(9))        # not this shard's job
    assert not m.offer(tuner_subject("j"), tuner_headers("j", 9), b"version 9\nbad\n")
    assert m.version("j") == 3 and counters["tuner_mirror_refused"] == 1


def test_a_job_taken_over_continues_the_buses_version_numbers(tmp_path):
    """A shard that never ran the job (a fresh file) and one that ran it before another shard moved its
    versions on: both continue above the bus's newest version, so the nodes accept their next one."""
    counters = {}
    mirror = TunerMirror(["j"], counters)
    retuning = CentralRetuning(RetunerConfig(dry_run=False, jobs=("j",)), str(tmp_path / "c-{job}.conf"),
                               None).validate(["j"])
    retuners = {}
    make = retuner_factory(retuning, retuners, seed=mirror.seed)
    first = make("j")
    assert first.retuner.pusher.version == 0 and counters["tuner_seeded"] == 0          # nothing on the bus yet
    assert first.retuner.pusher.push([RULE]) == 1
    # the job moves to another shard, which applies versions 2..4 (the bus keeps the file of 1..4)
    other = ConfigPusher(tmp_path / "other.conf", dry_run=False)
    for rules in ([RULE], [], [RULE], []):
        other.push(rules)
    assert other.history[0] == first.retuner.pusher.history[0]     # it continued from version 1 the same way
    mirror.offer(tuner_subject("j"), tuner_headers("j", 4), format_configs(other.history).encode())
    again = make("j")                              # the job moves back: its retuner was behind, rebuilt
    assert again is not first and retuners["j"] is again and counters["tuner_seeded"] == 1
    assert again.retuner.pusher.version == 4 and again.retuner.pusher.push([RULE]) == 5
    assert [c.version for c in read_configs(tmp_path / "c-j.conf")] == [1, 2, 3, 4, 5]
    assert make("j") is again                      # not behind: kept (its versions, its memory)
    for jr in retuners.values():
        jr.close()
