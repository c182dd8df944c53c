"""One start / wait / stop sequence for every service (``dynamiccl.contracts.lifecycle``), and the three service
commands (collector, detector, retuner) that run through it."""
from __future__ import annotations

import argparse
import io
import signal
import threading

import pytest

from dynamiccl.contracts.lifecycle import EXIT_STUCK, ServiceRun, run_service, stop_on_signals


class _Exit(BaseException):
    """What the injected exit hook raises, so a test sees the status without the process ending."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def _exit(status: int):
    raise _Exit(status)


class FakeService:
    """Stands in for Pipeline / DetectorService / RetunerService: the attributes their ready and stopped lines
    read, a start that receives the operator's first SIGTERM, and a stop that may be stuck."""

    def __init__(self, *_args, second_signal: bool = False, **_kw):
        self.second_signal = second_signal
        self.stops = 0
        self.addresses = {"listen": ["unix:/x"], "metrics": None, "features": None, "serve": None}
        self.metrics_address = None
        self.metrics = self
        self.retuner = self
        self.counters = {"changes": 0, "windows": 0, "pushes": 0, "rollbacks": 0}
        self.dropped, self.version = {}, 0

    # metrics of the three services
    def snapshot(self):
        return {"records_received_total": 0, "records_decoded_total": 0, "windows_emitted_total": 0}

    def value(self, _name):
        return 0.0

    def start(self):
        signal.raise_signal(signal.SIGTERM)
        return self

    def _stop(self, *_a, **_kw):
        self.stops += 1
        if self.second_signal:  # the operator gives up on a stuck stop
            signal.raise_signal(signal.SIGTERM)

    shutdown = stop = _stop


def _svc_run(**kw) -> ServiceRun:
    base = dict(ready=lambda s: "ready", stop=lambda s: s.stop(), stopped=lambda s: "stopped", out=io.StringIO())
    base.update(kw)
    return ServiceRun("demo", **base)


def test_a_signal_stops_the_service_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    svc = FakeService()
    run = _svc_run(start=svc.start)
    assert run_service(run, exit=_exit) == 0
    assert svc.stops == 1 and run.out.getvalue() == "ready\nstopped\n"
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("exc, status", [(OSError(98, "Address already in use"), 1), (ValueError("bad token"), 2)])
def test_start_errors_print_one_line_and_map_to_their_status(exc, status, capsys):
    def start():
        raise exc

    run = _svc_run(start=start, start_errors=(((ValueError,), 2), ((OSError,), 1)))
    assert run_service(run, exit=_exit) == status
    err = capsys.readouterr().err
    assert err == f"dynamiccl demo: error: {getattr(exc, 'strerror', None) or exc}\n"
    assert run.out.getvalue() == ""


def test_an_unmapped_start_error_is_not_swallowed():
    def start():
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        run_service(_svc_run(start=start), exit=_exit)


def test_a_second_signal_exits_at_once():
    svc = FakeService(second_signal=True)
    with pytest.raises(_Exit) as info:
        run_service(_svc_run(start=svc.start), exit=_exit)
    assert info.value.status == EXIT_STUCK


def test_a_stop_past_its_deadline_exits_naming_it(capsys):
    release = threading.Event()
    svc = FakeService()
    run = _svc_run(start=svc.start, stop=lambda s: release.wait(10), shutdown_timeout_s=0.05)
    try:
        with pytest.raises(_Exit) as info:
            run_service(run, exit=_exit)
    finally:
        release.set()
    assert info.value.status == EXIT_STUCK
    assert "dynamiccl demo: error: shutdown did not finish within 0.05 s" in capsys.readouterr().err
    assert run.out.getvalue() == "ready\n"


def test_stop_on_signals_sets_the_event_once_then_exits():
    with stop_on_signals(exit=_exit) as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.is_set()
        with pytest.raises(_Exit):
            signal.raise_signal(signal.SIGINT)


# ---- the three service commands ------------------------------------------------------------------------------
def _parse(module, argv):
    p = argparse.ArgumentParser()
    module.register(p.add_subparsers(dest="command"))
    return p.parse_args(argv)


SERVICES = {
    "collector": ("dynamiccl.collector.cli", "dynamiccl.collector.pipeline.Pipeline",
                  ["collector", "--listen", "off", "--metrics", "off", "--features", "off", "--parquet", "off"]),
    "detector": ("dynamiccl.detector.cli", "dynamiccl.detector.runner.DetectorService",
                 ["detector", "run", "--metrics", "off", "--serve", "off"]),
    "retuner": ("dynamiccl.retuner.cli", "dynamiccl.retuner.service.RetunerService",
                ["retuner", "run", "--metrics", "off", "--audit", "off"]),
}


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_exits_on_a_second_signal_during_a_stuck_stop(name, monkeypatch):
    """Before the one lifecycle only the collector did; the detector and retuner waited for their stop."""
    import importlib
    module_name, service_path, argv = SERVICES[name]
    module = importlib.import_module(module_name)
    monkeypatch.setattr(service_path, lambda *a, **kw: FakeService(second_signal=True))
    monkeypatch.setattr("os._exit", _exit)
    args = _parse(module, argv)
    with pytest.raises(_Exit) as info:
        args.func(args)
    assert info.value.status == EXIT_STUCK


STOPPED = {"collector": "collector stopped: ", "detector": "detector stopped: ", "retuner": "changes="}


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_prints_ready_and_stopped(name, monkeypatch, capsys):
    import importlib
    module_name, service_path, argv = SERVICES[name]
    module = importlib.import_module(module_name)
    monkeypatch.setattr(service_path, lambda *a, **kw: FakeService())
    args = _parse(module, argv)
    assert args.func(args) == 0
    out = capsys.readouterr()
    text = out.err if name == "detector" else out.out  # the detector's stdout carries the changes
    ready = [i for i, line in enumerate(text.splitlines()) if line.startswith(f"{name} ready:")]
    stopped = [i for i, line in enumerate(text.splitlines()) if line.startswith(STOPPED[name])]
    assert len(ready) == len(stopped) == 1 and ready < stopped, text


def test_a_signal_while_the_main_thread_holds_the_stop_events_lock_still_stops():
    """The wait loop holds the stop event's (non-reentrant) lock for an instant on every tick; a signal landing
    then used to deadlock in the handler's ``Event.set`` (a collector that never exited after SIGTERM)."""
    import subprocess
    import sys
    code = (
        "import signal, sys\n"
        "from dynamiccl.contracts.lifecycle import stop_on_signals\n"
        "with stop_on_signals('t', exit=lambda s: sys.exit(9)) as stop:\n"
        "    with stop._cond:\n"
        "        signal.raise_signal(signal.SIGTERM)\n"
        "    print('stopped' if stop.wait(5) else 'not stopped')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "stopped", (r.returncode, r.stdout, r.stderr)
