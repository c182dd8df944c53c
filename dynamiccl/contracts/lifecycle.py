"""Run a service in the foreground until SIGINT/SIGTERM: the one start / wait / stop sequence of every
``dynamiccl <service> run``.

Rules, the same for every service:

* start-up errors print one line, ``dynamiccl NAME: error: WHAT``, and return the exit status their
  exception type maps to (a bad address or port in use: 1); after start-up nothing is fatal;
* the first signal asks for an orderly stop; a second one exits at once with status 3, because an operator
  who signals twice is saying the orderly stop is stuck (a wedged stop must never keep a service alive);
* a stop that takes longer than ``shutdown_timeout_s`` (when set) exits with status 3 as well, naming it;
* the handlers that were installed before are restored on the way out, so a caller (a test, the stack)
  gets its own back.

The ``exit`` hook defaults to :func:`os._exit`, looked up when it is needed (no clean-up that could wedge
again); tests inject their own.

>>> import io
>>> class Svc:
...     def start(self):
...         signal.raise_signal(signal.SIGTERM)   # an operator's SIGTERM right after start-up
...         return self
>>> out = io.StringIO()
>>> run_service(ServiceRun("demo", Svc().start, ready=lambda s: "demo ready", stop=lambda s: None,
...                        stopped=lambda s: "demo stopped", out=out))
0
>>> out.getvalue()
'demo ready\\ndemo stopped\\n'
"""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TextIO

__all__ = ["ServiceRun", "run_service", "stop_on_signals", "bounded_call", "STOP_SIGNALS", "EXIT_STUCK"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_STUCK = 3  # a second signal, or a stop past its deadline


@contextlib.contextmanager
def stop_on_signals(name: str = "dynamiccl", *, signals=STOP_SIGNALS,
                    exit: Callable[[int], Any] | None = None) -> Iterator[threading.Event]:
    """An event the first of ``signals`` sets; a second signal calls ``exit(EXIT_STUCK)``. Main thread only."""
    stop = threading.Event()
    asked: list[int] = []
    log = logging.getLogger(name)

    def _handler(signum, _frame):
        if asked:
            (exit or os._exit)(EXIT_STUCK)
            return
        asked.append(signum)
        log.info("received %s; shutting down", signal.Signals(signum).name)
        # Event.set takes the event's (non-reentrant) lock, which this main thread holds for an instant on
        # every tick of its wait: set it from another thread, so the handler never waits on its own lock
        threading.Thread(target=stop.set, name=f"{name}-stop", daemon=True).start()

    previous = {s: signal.signal(s, _handler) for s in signals}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def bounded_call(fn: Callable[[], Any], timeout_s: float, *, name: str = "dynamiccl-shutdown") -> bool:
    """Run ``fn`` on a daemon thread; False when it has not returned within ``timeout_s`` (it keeps running)."""
    done = threading.Event()

    def _run():
        try:
            fn()
        finally:
            done.set()

    threading.Thread(target=_run, name=name, daemon=True).start()
    return done.wait(timeout_s)


@dataclass(frozen=True)
class ServiceRun:
    """What :func:`run_service` needs to know about one service ``S``."""
    name: str                                 # "collector": its messages read "dynamiccl collector: ..."
    start: Callable[[], Any]                  # builds and starts the service, returns it
    ready: Callable[[Any], str]               # the line printed once it is up
    stop: Callable[[Any], None]               # the orderly stop
    stopped: Callable[[Any], str]             # the line printed after it (its counters)
    out: TextIO | None = None                 # where the two lines go (None: sys.stdout at run time)
    start_errors: tuple = (((OSError,), 1),)  # (exception types, exit status) pairs, first match wins
    shutdown_timeout_s: float | None = None   # None: the stop is bounded by the service itself
    tick_s: float = 0.5                       # how often the wait wakes up (signals interrupt it anyway)


def _start_error(run: ServiceRun, exc: BaseException) -> int | None:
    for types, status in run.start_errors:
        if isinstance(exc, types):
            return status
    return None


def run_service(run: ServiceRun, *, signals=STOP_SIGNALS, exit: Callable[[int], Any] | None = None) -> int:
    """Start ``run``'s service, wait for a signal, stop it; the exit status (module docstring)."""
    out = run.out if run.out is not None else sys.stdout
    with stop_on_signals(run.name, signals=signals, exit=exit) as stop:
        try:
            svc = run.start()
        except Exception as exc:
            status = _start_error(run, exc)
            if status is None:
                raise
            print(f"dynamiccl {run.name}: error: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return status
        print(run.ready(svc), file=out, flush=True)
        while not stop.wait(run.tick_s):
            pass
        if run.shutdown_timeout_s is None:
            run.stop(svc)
        elif not bounded_call(lambda: run.stop(svc), run.shutdown_timeout_s):
            print(f"dynamiccl {run.name}: error: shutdown did not finish within {run.shutdown_timeout_s:g} s; "
                  "exiting without it; where each thread was:", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError, ValueError):   # stderr without a descriptor (captured)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            (exit or os._exit)(EXIT_STUCK)
            return EXIT_STUCK
        print(run.stopped(svc), file=out, flush=True)
        return 0
