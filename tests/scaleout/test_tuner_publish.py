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


class WrongLastSequence(Exception):
    err_code = 10071                      # what nats-py's APIError carries when the compare-and-set fails


class FakeJS:
    """The stream's side of a publish: its compare-and-set on the subject's last sequence."""

    def __init__(self, fail: int = 0):
        self.sent, self.fail, self.last_seq = [], fail, 0

    async def publish(self, subject, data, timeout=None, headers=None):
        if self.fail:
            self.fail -= 1
            raise TimeoutError("no responders")
        if int(headers.get("Nats-Expected-Last-Subject-Sequence", self.last_seq)) != self.last_seq:
            raise WrongLastSequence("wrong last sequence")
        self.last_seq += 1
        self.sent.append((subject, headers, data))
        return type("Ack", (), {"seq": self.last_seq})()

    async def get_last_msg(self, stream, subject, direct=False):
        s, h, d = self.sent[-1]
        return type("Msg", (), {"subject": s, "headers": h, "data": d, "seq": self.last_seq})()


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
    old = first.retuner
    again = make("j")                              # the job moves back: its retuner was behind, rebuilt in place
    assert again is first and again.retuner is not old and counters["tuner_seeded"] == 1
    assert again.retuner.pusher.version == 4 and again.retuner.pusher.push([RULE]) == 5
    assert [c.version for c in read_configs(tmp_path / "c-j.conf")] == [1, 2, 3, 4, 5]
    kept = again.retuner
    assert make("j").retuner is kept               # not behind: kept (its versions, its memory)
    for jr in retuners.values():
        jr.close()


def test_two_shards_racing_for_a_job_store_one_version_and_the_loser_continues_from_it(tmp_path):
    """Both believe they own the job for a moment and both apply a version 2 with other rules: the
    stream's compare-and-set stores the first; the second is refused, counted, and its retuner rebuilt
    from the stored file, so its next version is 3 above the stored 2 (never a second, different 2)."""
    js = FakeJS()
    rebuilt = []
    shards = {}
    for name in ("a", "b"):
        counters = {}
        mirror = TunerMirror(["j"], counters)
        retuning = CentralRetuning(RetunerConfig(dry_run=False, jobs=("j",)), str(tmp_path / f"{name}-{{job}}.conf"),
                                   None).validate(["j"])
        factory = retuner_factory(retuning, {}, seed=mirror.seed)
        pub = TunerPublisher(js, counters, mirror, on_conflict=lambda job, f=factory: (rebuilt.append(job), f.rebuild(job)))
        shards[name] = (factory, pub, counters, mirror)
    (fa, pa, _ca, _ma), (fb, pb, cb, mb) = shards["a"], shards["b"]
    ja = fa("j")
    ja.retuner.pusher.push([RULE])
    asyncio.run(pa.publish_due({"j": ja.retuner.pusher}))
    mb.offer(tuner_subject("j"), tuner_headers("j", 1), js.sent[-1][2], 1)      # b hears version 1 ...
    jb = fb("j")                                                                # ... and gets the job
    assert jb.retuner.pusher.version == 1 and cb["tuner_seeded"] == 1
    ja.retuner.pusher.push([])                                                  # both apply a version 2
    jb.retuner.pusher.push([RULE, RULE])
    assert asyncio.run(pa.publish_due({"j": ja.retuner.pusher})) == 1
    assert asyncio.run(pb.publish_due({"j": jb.retuner.pusher})) == 0           # refused by the stream
    assert cb["tuner_publish_conflicts"] == 1 and rebuilt == ["j"] and len(js.sent) == 2
    assert jb.retuner.pusher.version == 2 and jb.retuner.pusher.history[-1] == ja.retuner.pusher.history[-1]
    assert jb.retuner.pusher.push([RULE]) == 3
    assert asyncio.run(pb.publish_due({"j": jb.retuner.pusher})) == 1           # continues above the stored 2
    assert [h["Dynamiccl-Tuner-Version"] for _, h, _ in js.sent] == ["1", "2", "3"]
    for jr in (ja, jb):
        jr.close()
