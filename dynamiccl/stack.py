"""``dynamiccl stack up|down|status|rules|kube|webhook``: the monitoring stack natively, without Docker.

``up`` starts, from binaries installed on this machine, the same stack ``docker compose up`` starts:
the collector (and the detector and retuner once those services are installed), Prometheus,
Alertmanager, Grafana (when a ``grafana`` binary exists) and the example alert webhook, all on
127.0.0.1 by default, with the configuration files of ``deploy/`` that compose mounts. The only
difference is the address of each service: compose reaches ``collector:9464``, the native stack
``127.0.0.1:9464``; :func:`render_prometheus` and :func:`render_alertmanager` rewrite exactly those
addresses and nothing else. Grafana's provisioning files need no rewrite (they read
``DYNAMICCL_PROMETHEUS_URL`` etc. from the environment).

Ports and paths come from the same environment variables as ``compose.yaml`` (:data:`PORT_ENV`).
Processes run in their own sessions; their pids, commands and logs live in the state directory
(``--state-dir``, default ``runs/stack``), so ``down`` and ``status`` work from another shell.
Every command's last line is ``key=value`` pairs.

>>> cfg = StackConfig.from_env({"PROMETHEUS_PORT": "19090"}, deploy_dir=DEFAULT_DEPLOY_DIR)
>>> cfg.ports["prometheus"], cfg.ports["collector"], cfg.address("prometheus")
(19090, 9464, '127.0.0.1:19090')
>>> StackConfig.from_env({"GRAFANA_PORT": "http"})
Traceback (most recent call last):
...
ValueError: GRAFANA_PORT: expected a port number 1..65535, got 'http'
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping

import yaml

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.rules import render_rule_files

# configuration lives in stack_config; re-exported because tests, kits and the CLI import it from here
from dynamiccl.stack_config import (  # noqa: F401
    AUDIT_FILE,
    CHANGES_FILE,
    COMPOSE_ADDRESSES,
    DEFAULT_DASHBOARDS_DIR,
    DEFAULT_DEPLOY_DIR,
    DEFAULT_RUNBOOK_URL,
    PORT_ENV,
    StackConfig,
    render_alertmanager,
    render_prometheus,
)
from dynamiccl.stack_services import (  # noqa: F401  (re-exported: tests import them from here)
    GRAFANA_PASSWORD_FILE,
    Service,
    _alert_log,
    _alertmanager,
    _collector,
    _demo_job,
    _detector,
    _find,
    _grafana,
    _prometheus,
    _recording_exit,
    _retuner,
    grafana_admin_password,
)
from dynamiccl.webhook import AlertWebhook  # re-exported: tests and loop helpers import it from here

__all__ = [
    "StackConfig", "PORT_ENV", "COMPOSE_ADDRESSES", "render_prometheus", "render_alertmanager",
    "AlertWebhook", "Stack", "register", "DEFAULT_DEPLOY_DIR", "DEFAULT_DASHBOARDS_DIR",
]

log = logging.getLogger("dynamiccl.stack")


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text, fsync=False)


# ------------------------------------------------------------------------------------------------
# process management
# ------------------------------------------------------------------------------------------------
class Stack:
    """The native stack in ``config.state_dir``: ``up()``, ``down()``, ``status()``."""

    def __init__(self, config: StackConfig, *, python: str = sys.executable):
        self.config = config
        self.python = python
        self.state_dir = Path(config.state_dir)
        self.pidfile = self.state_dir / "pids.json"

    # -- plan ---------------------------------------------------------------------------------
    def render(self) -> dict[str, Path]:
        """Write the native copies of prometheus.yml and alertmanager.yml; return their paths."""
        c = self.config
        addrs = {s: f"{'127.0.0.1' if c.bind in ('0.0.0.0', '') else c.bind}:{p}" for s, p in c.ports.items()}
        conf = self.state_dir / "config"
        prom = conf / "prometheus.yml"
        am = conf / "alertmanager.yml"
        rules = render_rule_files(c.deploy_dir / "prometheus/rules", conf / "rules", runbook_url=c.runbook_url,
                                  grafana_url=c.grafana_external_url or c.url("grafana"))
        prom_cfg = render_prometheus(c.prometheus_config or c.deploy_dir / "prometheus/prometheus.yml", addrs,
                                     scrape_interval=c.scrape_interval)
        prom_cfg["rule_files"] = [str(p.resolve()) for p in rules]
        if c.sd_dir:
            for job in prom_cfg.get("scrape_configs", []):
                for sd in job.get("file_sd_configs", []):
                    sd["files"] = [str(Path(c.sd_dir) / Path(f).name) for f in sd["files"]]
        _write_atomic(prom, yaml.safe_dump(prom_cfg, sort_keys=False))
        _write_atomic(am, yaml.safe_dump(render_alertmanager(
            c.deploy_dir / "alertmanager/alertmanager.yml", addrs), sort_keys=False))
        return {"prometheus": prom, "alertmanager": am}

    def plan(self) -> tuple[list[Service], list[str]]:
        """Services to start, and notes about what is missing (binary not installed, ...)."""
        c = self.config
        files = self.render()
        py = [self.python, "-m", "dynamiccl"]
        # the start order: each service after the ones it reads from
        planned = [_collector(c, py, self.state_dir), _detector(c, py), _retuner(c, py), _alert_log(c, py),
                   _alertmanager(c, files["alertmanager"], self.state_dir),
                   _prometheus(c, files["prometheus"], self.state_dir), _grafana(c, self.state_dir),
                   _demo_job(c, py, self.state_dir)]
        svcs = [svc for svc, _ in planned if svc is not None]
        notes = [note for _, note in planned if note]
        if c.only is not None:
            unknown = set(c.only) - {s.name for s in svcs}
            if unknown:
                raise ValueError(f"--services: {', '.join(sorted(unknown))} not in this plan "
                                 f"({', '.join(s.name for s in svcs)})")
            svcs = [s for s in svcs if s.name in c.only]
        return svcs, notes

    # -- state ----------------------------------------------------------------------------------
    def _read(self) -> dict[str, dict]:
        try:
            return json.loads(self.pidfile.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            raise ValueError(f"{self.pidfile}: corrupt (not JSON); delete it after checking no stack runs")

    @staticmethod
    def _alive(entry: dict) -> bool:
        """The recorded process still runs and is still the one we started (guards against pid reuse)."""
        try:
            cmd = Path(f"/proc/{entry['pid']}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return False
        return bool(cmd) and cmd[0].decode(errors="replace") == entry["argv"][0]

    # -- lifecycle ------------------------------------------------------------------------------
    def up(self, *, timeout: float = 60.0, out=print) -> int:
        self.config.validate()
        running = {n: e for n, e in self._read().items() if self._alive(e)}
        if running:
            raise ValueError(f"a stack already runs from {self.state_dir} ({', '.join(running)}); "
                             f"`dynamiccl stack down` first")
        if _find("prometheus") is None:
            raise FileNotFoundError("prometheus binary not found on PATH (Debian: apt-get install prometheus; "
                                    "or use `docker compose up`)")
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        svcs, notes = self.plan()
        for n in notes:
            out(f"note: {n}")
        state: dict[str, dict] = {}
        try:
            for s in svcs:
                logf = self.state_dir / "logs" / f"{s.name}.log"
                if s.stdout is not None:
                    s.stdout.parent.mkdir(parents=True, exist_ok=True)
                with open(logf, "ab") as fh, open(s.stdout or os.devnull, "ab") as out_fh:
                    p = subprocess.Popen(s.argv, stdout=out_fh if s.stdout else fh, stderr=fh,
                                         stdin=subprocess.DEVNULL, env={**os.environ, **s.env},
                                         start_new_session=True)
                state[s.name] = {"pid": p.pid, "argv": s.argv, "health": s.health, "log": str(logf),
                                 "oneshot": s.oneshot}
                if s.stdout is not None:
                    state[s.name]["stdout"] = str(s.stdout)
                _write_atomic(self.pidfile, json.dumps(state, indent=1))
                if s.health and not _wait_http(s.health, timeout, proc=p):
                    raise RuntimeError(f"{s.name} did not become ready at {s.health} within {timeout:.0f} s; "
                                       f"see {logf}")
                out(f"started {s.name} pid={p.pid}" + (f" {s.health}" if s.health else ""))
        except BaseException:
            self.down(out=lambda *_: None)
            raise
        for line in summary_lines(self.config, state):
            out(line)
        out(f"stack=up services={','.join(state)} state_dir={self.state_dir}")
        return 0

    def down(self, *, timeout: float = 15.0, out=print) -> int:
        state = self._read()
        stopped = []
        for name, e in reversed(list(state.items())):
            if not self._alive(e):
                continue
            try:
                os.killpg(e["pid"], signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + timeout
            while self._alive(e) and time.monotonic() < deadline:
                _reap(e["pid"])
                time.sleep(0.1)
            if self._alive(e):
                os.killpg(e["pid"], signal.SIGKILL)
            _reap(e["pid"])
            stopped.append(name)
            out(f"stopped {name} pid={e['pid']}")
        self.pidfile.unlink(missing_ok=True)
        out(f"stack=down stopped={','.join(stopped) or '-'}")
        return 0

    def status(self, *, out=print) -> int:
        state = self._read()
        if not state:
            out(f"no stack recorded in {self.state_dir}")
            out("stack=down running=0 healthy=0")
            return 3
        running = healthy = finished = 0
        for name, e in state.items():
            alive = self._alive(e)
            done = not alive and e.get("oneshot") and self._exit_code(name) == 0
            ok = alive and (e["health"] is None or _wait_http(e["health"], 0.0))
            running += alive
            healthy += ok
            finished += bool(done)
            word = "running" if alive else "finished" if done else "dead"
            out(f"{name:14s} {word:8s} {'healthy' if ok else '-':8s} pid={e['pid']} {e['health'] or ''}")
        # a one-shot service (the demo job) that ended with status 0 did its work: not a failure
        whole = running + finished == len(state)
        out(f"stack={'up' if whole else 'degraded'} running={running} healthy={healthy} finished={finished} "
            f"services={len(state)}")
        return 0 if healthy + finished == len(state) else 1

    def _exit_code(self, name: str) -> int | None:
        try:
            return int((self.state_dir / f"{name}.rc").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None


def summary_lines(c: StackConfig, started: Mapping[str, dict]) -> list[str]:
    """What `up` prints after starting: URLs of the services that were started (no Grafana link without a
    Grafana), the plugin address, and where the regime changes go."""
    urls = [f"{name.capitalize()} {c.url(name)}" for name in ("prometheus", "alertmanager", "grafana")
            if name in started]
    lines = ["  ".join(urls + [f"plugin stream tcp:127.0.0.1:{c.ports['collector-plugin']}"])]
    if "grafana" in started and not os.environ.get("GRAFANA_ADMIN_PASSWORD"):
        lines.append(f"Grafana admin password: {c.state_dir / GRAFANA_PASSWORD_FILE} (0600)")
    if "detector" in started:
        lines.append(f"regime changes: {started['detector']['stdout']} (found by `dynamiccl report "
                     f"{c.parquet_dir}`)")
    return lines


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if proc is not None and proc.poll() is not None:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


# ------------------------------------------------------------------------------------------------
# CLI (dynamiccl/stack_cli.py)
# ------------------------------------------------------------------------------------------------
def register(sub) -> None:
    from dynamiccl.stack_cli import register as register_cli
    register_cli(sub)
