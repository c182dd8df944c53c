"""Heartbeats and checkpoints from the key-value bucket, timed on the observer's clock; a silent node's
windows stop waiting for it."""
from __future__ import annotations

from dynamiccl.scaleout.liveness import Liveness, ckpt_key, comb_key, node_key, shard_key
from dynamiccl.scaleout.merger import MergerConfig, ShardTable, WindowMerger
from tests.scaleout.helpers import Clock, events, partials


def _live(clock, ckpt=None):
    return Liveness(ShardTable(1.5, clock), {} if ckpt is None else ckpt, node_ttl_s=5.0, clock=clock)


def test_shard_heartbeats_share_ownership_and_expire():
    clock = Clock()
    live = _live(clock)
    live.heard(shard_key("s0"))
    live.heard(shard_key("s1"))
    assert live.table.live() == ["s0", "s1"]
    for t in (0.5, 1.0, 1.5, 2.0):
        clock.t = t
        live.heard(shard_key("s1"))
    assert live.table.live() == ["s1"]


def test_silent_node_and_checkpoints_and_malformed_keys():
    clock, ckpt = Clock(), {}
    live = _live(clock, ckpt)
    live.heard(node_key("j", "n0"))
    live.heard(node_key("j", "n1"))
    clock.t = 4.0
    live.heard(node_key("j", "n0"))
    clock.t = 6.0
    assert live.silent("j", {"n0", "n1", "n2"}) == {"n1"}      # n2 never heard: waited for, not silent
    live.heard(ckpt_key("j"), b"7")
    live.heard(ckpt_key("j"), b"5")                              # an older checkpoint never moves it back
    assert ckpt == {"j": 7}
    for bad in ("ckpt.j", "node.j", "other.x"):
        live.heard(bad, b"x")
    assert live.counters["malformed"] == 3
    live.heard(comb_key("j"), b'{"v":1}')                        # a partitioned job's combiner state: kept
    for bad in (b"", b"x" * ((1 << 20) + 1)):                    # empty or oversize: refused
        live.heard(comb_key("k"), bad)
    live.heard("comb.j.0", b"{}")                                # a partition has no combiner
    assert live.combiners == {"j": b'{"v":1}'} and live.counters["malformed"] == 6


def test_a_window_does_not_wait_for_a_silent_node():
    parts = partials(events())
    clock = Clock()
    m = WindowMerger(MergerConfig({"j": frozenset({"node0", "node1"})}, lateness_s=2.0), clock)
    w = sorted(parts)[1]
    m.add("j", parts[w][0])
    assert m.due() == []
    m.set_silent("j", frozenset({"node1"}))
    (_, wf), = m.due()                      # at once, not after the lateness
    assert wf.counters["missing_nodes"] == ["node1"]


def test_a_shard_whose_bucket_writes_fail_expires_no_peer_until_they_succeed_again():
    """After a NATS server died the bucket has no leader for seconds: no beat lands, so without the
    bucket clock each shard would expire the other and both would take every job."""
    import asyncio

    from dynamiccl.scaleout.central import CentralShard
    from dynamiccl.scaleout.liveness import BucketClock
    from dynamiccl.scaleout.service import ShardRunner

    class _Kv:
        fail = False

        async def put(self, key, value):
            if self.fail:
                raise TimeoutError("no response from stream")

    clock = Clock()
    bucket_clock = BucketClock(clock)
    table = ShardTable(1.5, bucket_clock)
    shard = CentralShard("s0", MergerConfig({"j": frozenset({"n0"})}), table, {}, lambda job: None, clock)
    kv = _Kv()
    runner = ShardRunner(shard, js=None, clock=clock, kv=kv, bucket_clock=bucket_clock)
    table.beat("s0")
    table.beat("s1")
    kv.fail = True
    for t in range(1, 21):                      # 10 s of failed writes, s0 looking every 0.5 s
        clock.t = t / 2
        assert not asyncio.run(runner._put("shard.s0", b"", 0.5))
        assert table.live() == ["s0", "s1"]
    assert runner.errors == 20 and bucket_clock.blackouts == 1
    kv.fail = False
    bucket_clock.echo()                             # the watcher hears the bucket again
    assert asyncio.run(runner._put("shard.s0", b"", 0.5))
    for t in (10.5, 11.0):                          # up to 1 s of working bucket: s1's silence not past the TTL
        clock.t = t
        bucket_clock.echo()
        table.beat("s0")                            # s0's own beat, back through the watcher
        assert table.live() == ["s0", "s1"]
    clock.t = 11.5
    assert table.live() == ["s0"]                   # s1 silent 1.5 s + of working bucket: expired


def test_a_deaf_watcher_stops_the_bucket_clock_though_writes_succeed():
    """After a server died the watcher's consumer is recreated for seconds: the shard's own beats are
    written but not heard back, and neither are its peers'; their silence must not count."""
    import asyncio

    from dynamiccl.scaleout.central import CentralShard
    from dynamiccl.scaleout.liveness import BucketClock
    from dynamiccl.scaleout.service import ShardRunner

    class _Kv:
        async def put(self, key, value):
            return None

    clock = Clock()
    bucket_clock = BucketClock(clock)
    table = ShardTable(1.5, bucket_clock)
    shard = CentralShard("s0", MergerConfig({"j": frozenset({"n0"})}), table, {}, lambda job: None, clock)
    runner = ShardRunner(shard, js=None, clock=clock, kv=_Kv(), bucket_clock=bucket_clock)
    table.beat("s0")
    table.beat("s1")
    for t in range(1, 21):                      # 10 s: writes succeed, nothing is heard back
        clock.t = t / 2
        assert asyncio.run(runner._put("shard.s0", b"", 0.5))
        assert table.live() == ["s0", "s1"]
    bucket_clock.echo()                         # the watcher is back: s0's own beat
    asyncio.run(runner._put("shard.s0", b"", 0.5))
    for t in (10.5, 11.0):
        clock.t = t
        bucket_clock.echo()
        table.beat("s0")
        asyncio.run(runner._put("shard.s0", b"", 0.5))
        assert table.live() == ["s0", "s1"]
    clock.t = 11.5                              # time stood still since the last update heard (t=0):
    assert table.live() == ["s0", "s1"]         # s1 has its whole TTL after the watcher came back
    clock.t = 11.6
    assert table.live() == ["s0"]


def test_a_stale_watcher_is_recreated_and_old_values_do_not_revive_a_dead_shard():
    import asyncio
    from types import SimpleNamespace

    from dynamiccl.scaleout.liveness import watch

    class _Watcher:
        def __init__(self, entries):
            self.entries = list(entries)

        async def updates(self, timeout):
            if not self.entries:
                await asyncio.sleep(timeout)
                raise asyncio.TimeoutError
            e = self.entries.pop(0)
            return e

        async def stop(self):
            return None

    def put(key, rev):
        return SimpleNamespace(key=key, value=b"", operation=None, revision=rev)
    # the first watcher goes deaf after two beats; the second starts with each key's last value
    kv = SimpleNamespace(watchers=[_Watcher([put("shard.s1", 1), put("shard.s0", 2)]),
                                   _Watcher([put("shard.s1", 1), put("shard.s0", 9), None])])

    async def watchall():
        return kv.watchers.pop(0)
    kv.watchall = watchall
    heard = []
    live = SimpleNamespace(counters={}, heard=lambda key, value: heard.append(key))
    loop = asyncio.new_event_loop()
    t0 = loop.time()
    loop.run_until_complete(watch(kv, live, stop=lambda: loop.time() - t0 > 0.5, stale_s=0.1))
    loop.close()
    assert live.counters["rewatch"] >= 1
    assert heard == ["shard.s1", "shard.s0", "shard.s0"]     # s1's old beat (revision 1) not fed again


def test_the_bucket_clock_stands_still_for_a_bounded_time():
    from dynamiccl.scaleout.liveness import BucketClock
    clock = Clock()
    c = BucketClock(clock, max_stall_s=10.0)
    c.failed()
    clock.t = 5.0
    assert c() == 0.0
    clock.t = 30.0                          # cut off for good: time runs again after 10 s
    assert c() == 20.0
    c.ok()
    clock.t = 31.0
    assert c() == 21.0


def test_a_busy_shard_is_not_deaf():
    """After a long merge the heartbeat task may run before the watcher catches up: one unheard
    write after a pause is a busy process, three are a deaf watcher."""
    from dynamiccl.scaleout.liveness import BucketClock
    clock = Clock()
    c = BucketClock(clock)
    clock.t = 5.0
    c.written()
    assert not c.deaf(1.0)
    c.written()
    c.written()
    assert c.deaf(1.0)
    c.echo()
    assert not c.deaf(1.0)
