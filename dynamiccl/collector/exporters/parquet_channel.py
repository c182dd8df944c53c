"""How the parquet exporter talks to its writer: a child process or a thread, one interface.

``send(msg)`` hands a command over (raises :class:`WriterDied` if the writer is gone);
``poll(timeout)`` returns the replies available within ``timeout`` seconds (raises
:class:`WriterDied` once the writer has gone and every reply it sent has been read);
``close(timeout)`` asks it to finish and reaps it, killing it after ``timeout``; ``kill()``
ends it at once; ``drain()`` returns the replies a dead writer sent before it went. Messages are described in :mod:`dynamiccl.collector.exporters.parquet_writer`.
"""
from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

from dynamiccl.collector.exporters.parquet_writer import SlabMemory, WriterCore

__all__ = ["WriterDied", "ProcessChannel", "ThreadChannel"]


class WriterDied(Exception):
    """The writer process exited (or the writer thread stopped) unexpectedly."""


def _package_root() -> str:
    from dynamiccl import collector
    return os.path.dirname(os.path.dirname(os.path.abspath(collector.__file__)))


class ProcessChannel:
    """``python -m dynamiccl.collector.exporters.parquet_writer`` sharing ``memory`` (a memfd)."""

    kind = "process"

    def __init__(self, memory: SlabMemory, *, compression: str):
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dynamiccl.collector.exporters.parquet_writer",
                 "--ctl-fd", str(theirs.fileno()), "--slab-fd", str(memory.fd),
                 "--slabs", str(memory.n_slabs), "--slab-rows", str(memory.slab_rows),
                 "--compression", compression],
                pass_fds=(theirs.fileno(), memory.fd), stdin=subprocess.DEVNULL, env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.pid = self.proc.pid
        self._dead = False

    def send(self, msg: tuple) -> None:
        if self._dead or self.proc.poll() is not None:
            self._dead = True
            raise WriterDied(f"parquet writer process exited (code {self.proc.returncode})")
        try:
            self.conn.send(msg)
        except (OSError, EOFError) as exc:
            self._dead = True
            raise WriterDied(f"parquet writer process is gone ({exc})") from exc

    def poll(self, timeout: float = 0.0) -> list[tuple]:
        out: list[tuple] = []
        if self._dead:
            raise WriterDied("parquet writer process is gone")
        try:
            wait = timeout
            while self.conn.poll(wait):
                out.append(self.conn.recv())
                wait = 0.0
        except (OSError, EOFError) as exc:
            self._dead = True
            if out:  # hand over what it said before dying; the next poll raises
                return out
            raise WriterDied(f"parquet writer process exited (code {self._reap(1.0)})") from exc
        return out

    def alive(self) -> bool:
        return not self._dead and self.proc.poll() is None

    def drain(self) -> list[tuple]:
        """After ``kill()``: the replies it sent before it went (never raises); closes the channel."""
        out: list[tuple] = []
        try:
            while self.conn.poll(0):
                out.append(self.conn.recv())
        except (OSError, EOFError):
            pass
        try:
            self.conn.close()
        except OSError:
            pass
        return out

    def _reap(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def close(self, timeout: float) -> None:
        try:
            self.conn.close()  # end of file: the writer closes its files and exits
        except OSError:
            pass
        self._dead = True
        self._reap(timeout)

    def kill(self) -> None:
        self._dead = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class ThreadChannel:
    """The same writer in a thread of this process (fallback; also ``writer="thread"``)."""

    kind = "thread"
    pid = None

    def __init__(self, memory: SlabMemory, *, compression: str):
        self._cmd: queue.SimpleQueue = queue.SimpleQueue()
        self._rep: queue.SimpleQueue = queue.SimpleQueue()
        self.core = WriterCore(memory, compression=compression, reply=self._rep.put)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dynamiccl-parquet-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                msg = self._cmd.get()
                if msg is None or not self.core.handle(msg):
                    break
        except BaseException as exc:  # pragma: no cover - WriterCore catches write errors itself
            self._error = exc
        finally:
            self._rep.put(None)

    def send(self, msg: tuple) -> None:
        if not self._thread.is_alive():
            raise WriterDied(f"parquet writer thread stopped ({self._error!r})")
        self._cmd.put(msg)

    def poll(self, timeout: float = 0.0) -> list[tuple]:
        out: list[tuple] = []
        try:
            msg = self._rep.get(timeout=timeout) if timeout > 0 else self._rep.get_nowait()
            while True:
                if msg is None:
                    if out:
                        self._rep.put(None)
                        return out
                    raise WriterDied(f"parquet writer thread stopped ({self._error!r})")
                out.append(msg)
                msg = self._rep.get_nowait()
        except queue.Empty:
            return out

    def alive(self) -> bool:
        return self._thread.is_alive()

    def drain(self) -> list[tuple]:
        out: list[tuple] = []
        try:
            while (msg := self._rep.get_nowait()) is not None:
                out.append(msg)
        except queue.Empty:
            pass
        return out

    def close(self, timeout: float) -> None:
        self._cmd.put(None)
        self._thread.join(timeout)

    def kill(self) -> None:  # a thread cannot be killed; stop feeding it
        self._cmd.put(None)
