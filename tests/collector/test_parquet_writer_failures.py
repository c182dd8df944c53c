"""The parquet writer process dying, hanging, or outliving its collector."""
from __future__ import annotations

import glob
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import ParquetConfig
from dynamiccl.collector.exporters import parquet as parquet_mod
from dynamiccl.collector.exporters.parquet import ParquetExporter
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.harness.collector_testing import encode_frame, encode_frames, process_record, synthetic_events

from collector_helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600 * 10**9
T0 = 1_700_000_000 * 10**9 // HOUR * HOUR


def _rows(d) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows
               for f in glob.glob(os.path.join(str(d), "**", "*.parquet"), recursive=True))


def _tmp_files(d) -> list[str]:
    return glob.glob(os.path.join(str(d), "**", "*.tmp.*"), recursive=True)


def _batch(i: int, n: int = 100) -> RecordBatch:
    return RecordBatch(synthetic_events(n, nranks=2, seed=i, start_ns=T0 + 10**9 + i * 10**7), "h", "j", {})


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def _kill_writer(exp: ParquetExporter) -> int:
    """SIGKILL the writer process and wait until it can be reaped. A killed multi-threaded process
    shows state Z while its other threads still exit, and until then ``waitpid`` does not report
    it (nor is its socket closed), so /proc is not a reliable sign of its death."""
    channel = exp._channel
    os.kill(channel.pid, signal.SIGKILL)
    assert wait_until(lambda: channel.proc.poll() is not None, 10)
    return channel.pid


def _exporter(d, **kw) -> ParquetExporter:
    cfg = ParquetConfig(directory=str(d), **{"row_group_rows": 1000, "max_buffered_rows": 2000,
                                             "flush_rows": 10**6, "flush_interval_s": 3600, **kw})
    exp = ParquetExporter(cfg, metrics=SelfMetrics())
    exp.start()
    return exp


def test_writer_killed_is_counted_logged_once_and_replaced(tmp_path, caplog):
    exp = _exporter(tmp_path)
    m = exp.metrics
    for i in range(15):  # 3000 rows: 3 slabs handed to the writer, none in a finished file yet
        exp.consume(_batch(i))
    assert exp.sync(30)
    first = exp.writer_pid
    with caplog.at_level(logging.ERROR, logger="dynamiccl.collector.exporters.parquet"):
        assert _kill_writer(exp) == first
        for i in range(15, 20):  # the collector keeps consuming; the death is found on the next send
            exp.consume(_batch(i))
        exp.tick()
        second = exp.writer_pid
        assert second not in (None, first) and exp.writer_kind == "process", (first, second, m.dropped, exp._free)
        assert _kill_writer(exp) == second  # a second death: counted, not logged again
        exp.tick()
        for i in range(20, 25):
            exp.consume(_batch(i))
        exp.shutdown()
    assert m.parquet_writer_deaths == 2
    # lost: the 3000 rows in the first writer's open file, the 1000 in the second's; the slab
    # being sent when the first death was found went to the replacement
    assert m.dropped["parquet_write_failed"] == 4000 and m.parquet_rows == 1000 == _rows(tmp_path)
    assert m.parquet_errors == 2  # one unfinished part file per death
    assert len([r for r in caplog.records if "writer died" in r.getMessage()]) == 1
    assert not _tmp_files(tmp_path)


def test_files_a_writer_finished_before_dying_are_not_counted_lost(tmp_path):
    now = [0.0]
    exp = ParquetExporter(ParquetConfig(directory=str(tmp_path), row_group_rows=1000, max_buffered_rows=2000,
                                        flush_interval_s=5), metrics=SelfMetrics(), clock=lambda: now[0])
    exp.start()
    exp.consume(_batch(0))
    now[0] = 6.0
    exp.tick()  # sends the slab and the close; the confirmation is not read yet
    assert wait_until(lambda: _rows(tmp_path) == 200, 30)
    pid = exp.writer_pid
    assert _kill_writer(exp) == pid
    exp.tick()  # finds the death, reads the confirmation it left behind
    m = exp.metrics
    assert m.parquet_writer_deaths == 1 and m.parquet_files == 1 and m.parquet_rows == 200
    assert m.dropped["parquet_write_failed"] == 0 and m.parquet_errors == 0
    exp.shutdown()


def test_a_finished_file_whose_confirmation_died_with_the_writer_is_counted_from_disk(tmp_path):
    """The writer renamed the part file (complete, on disk) and died before its reply went out: the
    file is counted as written from its own footer, not as lost (the race the test above can hit)."""
    from dynamiccl.collector.exporters.parquet_channel import WriterDied
    now = [0.0]
    exp = ParquetExporter(ParquetConfig(directory=str(tmp_path), row_group_rows=1000, max_buffered_rows=2000,
                                        flush_interval_s=5, writer="thread"), metrics=SelfMetrics(),
                          clock=lambda: now[0])
    exp.start()
    exp.consume(_batch(0))
    now[0] = 6.0
    exp.tick()
    assert wait_until(lambda: _rows(tmp_path) == 200, 30)
    rep = exp._channel._rep
    assert wait_until(lambda: not rep.empty(), 10)
    replies = []
    while not rep.empty():
        replies.append(rep.get_nowait())
    assert any(r[0] == "closed" for r in replies)  # the reply that is now "lost"
    exp._on_death(WriterDied("test: the writer went before its reply"))
    m = exp.metrics
    assert m.parquet_writer_deaths == 1 and m.parquet_files == 1 and m.parquet_rows == 200 == _rows(tmp_path)
    assert m.dropped["parquet_write_failed"] == 0 and m.parquet_errors == 0
    exp.shutdown()


def test_hung_writer_is_killed_after_the_timeout(tmp_path):
    exp = _exporter(tmp_path, writer_timeout_s=2.0)
    pid = exp.writer_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        for i in range(25):  # 5000 rows: needs a slab back after the first 2000
            exp.consume(_batch(i))
        waited = time.monotonic() - t0
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGCONT)
    m = exp.metrics
    # killed after 2 s; on a loaded machine its replacement may also be slow to start and killed
    assert m.parquet_writer_deaths >= 1 and exp.writer_pid != pid and waited >= 2.0
    exp.shutdown()
    assert m.dropped["parquet_write_failed"] >= 2000
    assert m.parquet_rows + m.dropped["parquet_write_failed"] == 5000 and m.parquet_rows == _rows(tmp_path)


def test_three_quick_deaths_fall_back_to_a_writer_thread(tmp_path):
    exp = _exporter(tmp_path)
    for k in range(parquet_mod.DEATHS_BEFORE_THREAD):
        pid = exp.writer_pid
        assert exp.writer_kind == "process"
        assert _kill_writer(exp) == pid
        exp.tick()
    assert exp.writer_kind == "thread" and exp.metrics.parquet_writer_deaths == 3
    for i in range(12):
        exp.consume(_batch(i))
    exp.shutdown()
    assert exp.metrics.parquet_rows == 2400 == _rows(tmp_path)


_CRASHING_COLLECTOR = textwrap.dedent("""
    import os, sys
    from dynamiccl.collector.component import RecordBatch
    from dynamiccl.collector.config import ParquetConfig
    from dynamiccl.collector.exporters.parquet import ParquetExporter
    from dynamiccl.harness.collector_testing import synthetic_events
    exp = ParquetExporter(ParquetConfig(directory=sys.argv[1], row_group_rows=1000, max_buffered_rows=2000))
    exp.start()
    for i in range(5):  # 1000 rows: one full slab, handed to the writer
        exp.consume(RecordBatch(synthetic_events(100, nranks=2, seed=i, start_ns=10**18), "h", "j", {}))
    assert exp.sync(30)
    print(exp.writer_pid, flush=True)
    os._exit(3)  # a crash: no shutdown, no atexit
""")


def test_writer_finishes_its_files_and_exits_when_the_collector_crashes(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _CRASHING_COLLECTOR, str(tmp_path)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 3, proc.stderr
    pid = int(proc.stdout.split()[0])
    assert wait_until(lambda: _gone(pid), 30)  # the orphaned writer saw end of file and exited
    assert _rows(tmp_path) == 1000 and not _tmp_files(tmp_path)


def test_cli_sigterm_to_the_process_group_flushes_and_leaves_no_writer_behind(tmp_path):
    """A service manager signals every process of the group: the writer ignores SIGTERM, the
    collector hands it its last rows and closes the channel, then the writer exits."""
    sock = os.path.join(tempfile.mkdtemp(prefix="dcpw"), "c.sock")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "dynamiccl", "collector", "--listen", f"unix:{sock}",
                             "--metrics", "off", "--features", "off", "--parquet", str(tmp_path / "pq")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().startswith("collector ready:")
        children = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        assert len(children) == 1 and "parquet_writer" in open(f"/proc/{children[0]}/cmdline").read()
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.sendall(encode_frame(process_record("h", "j", 1000)) + encode_frames(synthetic_events(100, nranks=2)))
        s.close()
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert wait_until(lambda: _gone(int(children[0])), 10)
    assert _rows(tmp_path / "pq") == 200


def test_writer_never_deadlocks_with_a_collector_that_sends_without_reading():
    """The collector sends while the writer's replies pile up unread: both must not block."""
    import threading

    from dynamiccl.collector.exporters.parquet_channel import ProcessChannel
    from dynamiccl.collector.exporters.parquet_writer import SlabMemory

    mem = SlabMemory(2, 16)
    ch = ProcessChannel(mem, compression="none")
    sender = threading.Thread(target=lambda: [ch.send(("close", i)) for i in range(100_000)], daemon=True)
    try:
        sender.start()
        sender.join(timeout=30)
        assert not sender.is_alive()  # before: blocked for ever once ~200 KB of replies were unread
        got = 0
        while got < 100_000:
            replies = ch.poll(5.0)
            assert replies
            got += len(replies)
    finally:
        ch.kill()
        mem.close()


def test_part_files_are_fsynced_before_rename(tmp_path, monkeypatch):
    import numpy as np

    import dynamiccl.collector.exporters.parquet_writer as pw
    from dynamiccl.collector.exporters.parquet_writer import SlabMemory, WriterCore
    from dynamiccl.harness.collector_testing import synthetic_events

    order = []
    monkeypatch.setattr(pw, "_fsync", lambda p: order.append(("fsync", p)))
    real_replace = pw.os.replace
    monkeypatch.setattr(pw.os, "replace", lambda a, b: (order.append(("rename", a)), real_replace(a, b)))
    mem = SlabMemory(1, 16)
    core = WriterCore(mem, compression="none", reply=lambda m: None)
    ev = synthetic_events(4, nranks=2)
    mem.records[0, :8] = ev
    tmp, path = str(tmp_path / "p.parquet.tmp.1"), str(tmp_path / "p.parquet")
    core.append(0, 8, np.array([[0, 8, 0, 0]]), [(1, tmp, path, "j")], ["h"], {})
    core.close(1)
    mem.close()
    assert order[0] == ("fsync", tmp) and order[1] == ("rename", tmp)


def test_read_only_history_directory_is_refused_at_start(tmp_path, monkeypatch):
    import builtins

    import pytest

    from dynamiccl.collector.metrics import SelfMetrics
    d = tmp_path / "ro"
    d.mkdir()
    real_open = builtins.open

    def read_only(path, mode="r", *a, **kw):  # a read-only mount (chmod does not stop root)
        if str(path).startswith(str(d)) and any(c in mode for c in "wax+"):
            raise OSError(30, "Read-only file system")
        return real_open(path, mode, *a, **kw)

    monkeypatch.setattr(builtins, "open", read_only)
    exp = ParquetExporter(ParquetConfig(directory=str(d)), metrics=SelfMetrics())
    with pytest.raises(OSError, match="parquet directory .*cannot write: Read-only file system"):
        exp.start()


def test_disk_full_keeps_the_row_groups_written_before_it(tmp_path, monkeypatch):
    import numpy as np
    import pyarrow.parquet as pq_mod

    from dynamiccl.collector.exporters.parquet_writer import SlabMemory, WriterCore
    from dynamiccl.harness.collector_testing import synthetic_events

    calls = {"n": 0}
    real = pq_mod.ParquetWriter.write_table

    def fills_up(self, table, *a, **kw):  # the disk fills up at the third row group
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real(self, table, *a, **kw)

    monkeypatch.setattr(pq_mod.ParquetWriter, "write_table", fills_up)
    replies = []
    mem = SlabMemory(1, 16)
    core = WriterCore(mem, compression="none", reply=replies.append)
    tmp, path = str(tmp_path / "p.parquet.tmp.1"), str(tmp_path / "p.parquet")
    for i in range(4):
        mem.records[0, :8] = synthetic_events(4, nranks=2, seed=i)
        core.append(0, 8, np.array([[0, 8, 0, 0]]), [(1, tmp, path, "j")], ["h"], {})
    core.close(1)
    mem.close()
    assert replies[-1][:3] == ("failed", 1, 16) and replies[-1][4] == 16   # before: all 32 rows lost
    assert pq_mod.read_table(path).num_rows == 16
