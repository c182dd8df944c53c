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

import copy
from contextlib import redirect_stderr as _redirect_stderr
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from dynamiccl.rules import render_rule_files
from dynamiccl.webhook import AlertWebhook  # re-exported: tests and loop helpers import it from here

__all__ = [
    "StackConfig", "PORT_ENV", "COMPOSE_ADDRESSES", "render_prometheus", "render_alertmanager",
    "AlertWebhook", "Stack", "register", "DEFAULT_DEPLOY_DIR", "DEFAULT_DASHBOARDS_DIR",
]

log = logging.getLogger("dynamiccl.stack")

_REPO = Path(__file__).resolve().parents[1]
#: a checkout's deploy/ when run from one, else the copy the wheel ships (pyproject force-include)
DEFAULT_DEPLOY_DIR = _REPO / "deploy" if (_REPO / "deploy").is_dir() else Path(__file__).resolve().parent / "deploy"
DEFAULT_DASHBOARDS_DIR = Path(__file__).resolve().parent / "dashboards" / "json"
#: runbooks of a checkout as file:// URLs (the wheel does not ship docs/: then the rules keep repository paths)
DEFAULT_RUNBOOK_URL = (_REPO / "docs" / "runbooks").as_uri() if (_REPO / "docs" / "runbooks").is_dir() else None
#: the file the detector's change log goes to, next to the parquet history (where `dynamiccl report` looks)
CHANGES_FILE = "changes.jsonl"
AUDIT_FILE = "retuner-audit.jsonl"

#: service → (environment variable, default port); compose.yaml reads the same variables
PORT_ENV: dict[str, tuple[str, int]] = {
    "prometheus": ("PROMETHEUS_PORT", 9090),
    "alertmanager": ("ALERTMANAGER_PORT", 9093),
    "grafana": ("GRAFANA_PORT", 3000),
    "collector": ("COLLECTOR_METRICS_PORT", 9464),
    "collector-features": ("COLLECTOR_FEATURES_PORT", 9465),
    "collector-plugin": ("COLLECTOR_PLUGIN_PORT", 9470),
    "detector": ("DETECTOR_METRICS_PORT", 9466),
    "detector-events": ("DETECTOR_EVENTS_PORT", 9467),
    "retuner": ("RETUNER_METRICS_PORT", 9468),
    "alert-log": ("ALERT_WEBHOOK_PORT", 9469),
}
#: the host:port each service has inside compose's network (what deploy/ files name)
COMPOSE_ADDRESSES = {
    "collector:9464": "collector", "detector:9466": "detector", "retuner:9468": "retuner",
    "prometheus:9090": "prometheus", "alertmanager:9093": "alertmanager", "alert-log:9469": "alert-log",
}


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"{name}: expected a port number 1..65535, got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class StackConfig:
    """Where the native stack listens and keeps its files. Build it with :meth:`from_env`."""
    deploy_dir: Path = DEFAULT_DEPLOY_DIR
    dashboards_dir: Path = DEFAULT_DASHBOARDS_DIR
    state_dir: Path = Path("runs/stack")
    parquet_dir: Path = Path("runs/stack/parquet")
    bind: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: {k: v[1] for k, v in PORT_ENV.items()})
    scrape_interval: str | None = None      # None: the file's (5s)
    demo: bool = False
    demo_scenario: str = "demo"
    grafana_external_url: str | None = None   # base of alert dashboard links; None: this stack's Grafana
    runbook_url: str | None = DEFAULT_RUNBOOK_URL
    prometheus_config: Path | None = None      # None: deploy_dir/prometheus/prometheus.yml
    sd_dir: str | None = None                  # directory of file_sd targets (Slurm kit); None: the file's
    only: tuple[str, ...] | None = None        # start only these services (a Slurm service node)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "StackConfig":
        env = os.environ if env is None else env
        ports = {svc: _port(env, var, default) for svc, (var, default) in PORT_ENV.items()}
        state = Path(overrides.pop("state_dir", None) or env.get("DYNAMICCL_STACK_DIR") or "runs/stack")
        kw: dict[str, Any] = {
            "deploy_dir": Path(env.get("DYNAMICCL_DEPLOY_DIR") or DEFAULT_DEPLOY_DIR),
            "dashboards_dir": Path(env.get("DYNAMICCL_DASHBOARDS_DIR") or DEFAULT_DASHBOARDS_DIR),
            "state_dir": state,
            "parquet_dir": Path(env.get("DYNAMICCL_PARQUET_DIR") or state / "parquet"),
            "bind": env.get("DYNAMICCL_BIND") or "127.0.0.1",
            "ports": ports,
            "grafana_external_url": env.get("DYNAMICCL_GRAFANA_EXTERNAL_URL") or None,
            "runbook_url": env.get("DYNAMICCL_RUNBOOK_URL") or DEFAULT_RUNBOOK_URL,
            "prometheus_config": Path(env["DYNAMICCL_PROMETHEUS_CONFIG"]) if env.get("DYNAMICCL_PROMETHEUS_CONFIG")
            else None,
            "sd_dir": env.get("DYNAMICCL_SD_DIR") or None,
        }
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)

    @property
    def run_dir(self) -> Path:
        """The parent of the parquet directory: `dynamiccl report PARQUET_DIR` finds its side files there."""
        return Path(self.parquet_dir).parent

    def address(self, service: str) -> str:
        return f"{self.bind}:{self.ports[service]}"

    def url(self, service: str) -> str:
        host = "127.0.0.1" if self.bind in ("0.0.0.0", "") else self.bind
        return f"http://{host}:{self.ports[service]}"

    def validate(self) -> "StackConfig":
        for name in ("prometheus/prometheus.yml", "alertmanager/alertmanager.yml",
                     "grafana/provisioning/datasources", "grafana/provisioning/dashboards"):
            if not (self.deploy_dir / name).exists():
                raise FileNotFoundError(
                    f"stack configuration {self.deploy_dir / name} not found: reinstall dynamiccl (the wheel "
                    f"ships it) or set DYNAMICCL_DEPLOY_DIR to a deploy/ directory")
        seen: dict[int, str] = {}
        for svc, port in self.ports.items():
            if port in seen:
                raise ValueError(f"port {port} is configured for both {seen[port]} and {svc}")
            seen[port] = svc
        return self


# ------------------------------------------------------------------------------------------------
# configuration rendering: the deploy/ files with compose addresses replaced by loopback ones
# ------------------------------------------------------------------------------------------------
def _swap(target: str, addresses: Mapping[str, str]) -> str:
    if target not in COMPOSE_ADDRESSES:
        raise ValueError(f"prometheus.yml: target {target!r} is not one of the stack's services "
                         f"({', '.join(COMPOSE_ADDRESSES)})")
    return addresses[COMPOSE_ADDRESSES[target]]


def render_prometheus(source: Path, addresses: Mapping[str, str], *, scrape_interval: str | None = None,
                      evaluation_interval: str | None = None) -> dict:
    """``deploy/prometheus/prometheus.yml`` for the native stack: service targets → ``addresses[service]``,
    rule file globs made absolute (so the rendered file may live anywhere). Nothing else changes.

    >>> d = render_prometheus(DEFAULT_DEPLOY_DIR / "prometheus/prometheus.yml",
    ...                       {s: f"127.0.0.1:{p}" for s, (_, p) in PORT_ENV.items()})
    >>> d["scrape_configs"][0]["static_configs"][0]["targets"], d["rule_files"][0].endswith("rules/*.yml")
    (['127.0.0.1:9464'], True)
    """
    source = Path(source)
    cfg = yaml.safe_load(source.read_text())
    cfg = copy.deepcopy(cfg)
    cfg["rule_files"] = [str((source.parent / p).resolve()) for p in cfg.get("rule_files", [])]
    for am in cfg.get("alerting", {}).get("alertmanagers", []):
        for sc in am.get("static_configs", []):
            sc["targets"] = [_swap(t, addresses) for t in sc["targets"]]
    for job in cfg.get("scrape_configs", []):
        for sc in job.get("static_configs", []):
            sc["targets"] = [_swap(t, addresses) for t in sc["targets"]]
    if scrape_interval:
        cfg["global"]["scrape_interval"] = scrape_interval
        cfg["global"]["scrape_timeout"] = scrape_interval
    if evaluation_interval or scrape_interval:
        cfg["global"]["evaluation_interval"] = evaluation_interval or scrape_interval
    return cfg


def render_alertmanager(source: Path, addresses: Mapping[str, str], *,
                        group_wait: str | None = None) -> dict:
    """``deploy/alertmanager/alertmanager.yml`` with ``http://SERVICE:PORT/...`` webhook URLs → loopback."""
    cfg = yaml.safe_load(Path(source).read_text())
    for rcv in cfg.get("receivers", []):
        for wh in rcv.get("webhook_configs", []):
            scheme, rest = wh["url"].split("://", 1)
            hostport, _, path = rest.partition("/")
            if hostport in COMPOSE_ADDRESSES:
                wh["url"] = f"{scheme}://{addresses[COMPOSE_ADDRESSES[hostport]]}/{path}"
    if group_wait:
        cfg["route"]["group_wait"] = group_wait
        for r in cfg["route"].get("routes", []):
            r["group_wait"] = group_wait
    return cfg


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# process management
# ------------------------------------------------------------------------------------------------
@dataclass
class Service:
    name: str
    argv: list[str]
    health: str | None                 # URL that answers 200 when ready
    env: dict[str, str] = field(default_factory=dict)
    stdout: Path | None = None         # where stdout goes (appended); None: the log with stderr
    oneshot: bool = False              # ends by itself (the demo job): ending with status 0 is not a failure


def _find(*names: str) -> str | None:
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def _cli_variant(command: str, candidates: list[list[str]]) -> list[str] | None:
    """The first argv that `dynamiccl` accepts for ``command`` (the services' CLIs are their own modules;
    the stack only starts a service whose command line it can build)."""
    from dynamiccl.cli import build_parser
    parser = build_parser()
    for argv in candidates:
        try:
            with open(os.devnull, "w") as null, _redirect_stderr(null):
                ns = parser.parse_args(argv)
        except SystemExit:
            continue
        if getattr(ns, "func", None) is not None:
            return argv
    return None


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
        notes: list[str] = []
        py = [self.python, "-m", "dynamiccl"]
        svcs = [Service("collector", py + [
            "collector", "--listen", f"unix:{self.state_dir.resolve() / 'dynamiccl.sock'}",
            "--listen", f"tcp:{c.address('collector-plugin')}", "--metrics", c.address("collector"),
            "--features", f"tcp:{c.address('collector-features')}", "--parquet", str(c.parquet_dir)]
            + ([] if _loopback(c.bind) else ["--allow-remote"]),  # DYNAMICCL_BIND set: remote was asked for
            f"{c.url('collector')}/metrics")]
        det = _cli_variant("detector", [
            ["detector", "--features", f"tcp:{c.address('collector-features')}", "--metrics", c.address("detector"),
             "--serve", f"tcp:{c.address('detector-events')}"],
            ["detector", "run", "--features", f"tcp:{c.address('collector-features')}", "--metrics",
             c.address("detector"), "--serve", f"tcp:{c.address('detector-events')}"]])
        if det:   # its stdout is the change log (one RegimeChange JSON per line), read by `dynamiccl report`
            svcs.append(Service("detector", py + det, f"{c.url('detector')}/metrics",
                                stdout=c.run_dir / CHANGES_FILE))
        else:
            notes.append("detector: no `dynamiccl detector` command taking --features/--metrics/--serve is "
                         "installed yet; skipped")
        ret = _cli_variant("retuner", [
            [*head, "--changes", f"tcp:{c.address('detector-events')}", "--features",
             f"tcp:{c.address('collector-features')}", "--metrics", c.address("retuner"),
             "--audit", str(c.run_dir / AUDIT_FILE)]
            for head in (["retuner", "run"], ["retuner"])])
        if ret:
            svcs.append(Service("retuner", py + ret, f"{c.url('retuner')}/metrics"))
        else:
            notes.append("retuner: no `dynamiccl retuner` command taking --changes/--features/--metrics is "
                         "installed yet; skipped")
        svcs.append(Service("alert-log", py + ["stack", "webhook", "--listen", c.address("alert-log")],
                            f"{c.url('alert-log')}/"))
        am = _find("prometheus-alertmanager", "alertmanager")
        if am:
            svcs.append(Service("alertmanager", [
                am, f"--config.file={files['alertmanager']}", f"--storage.path={self.state_dir / 'alertmanager'}",
                f"--web.listen-address={c.address('alertmanager')}", "--cluster.listen-address=",
                f"--web.external-url={c.url('alertmanager')}"], f"{c.url('alertmanager')}/-/ready"))
        else:
            notes.append("alertmanager: no prometheus-alertmanager/alertmanager binary on PATH "
                         "(Debian: apt-get install prometheus-alertmanager); skipped")
        prom = _find("prometheus")
        if prom:
            svcs.append(Service("prometheus", [
                prom, f"--config.file={files['prometheus']}", f"--storage.tsdb.path={self.state_dir / 'prometheus'}",
                f"--web.listen-address={c.address('prometheus')}", f"--web.external-url={c.url('prometheus')}",
                "--web.enable-lifecycle"], f"{c.url('prometheus')}/-/ready"))
        else:
            notes.append("prometheus: no prometheus binary on PATH (Debian: apt-get install prometheus)")
        gf = _find("grafana", "grafana-server")
        if gf:
            home = next((p for p in ("/usr/share/grafana", "/usr/local/share/grafana")
                         if Path(p).is_dir()), None)
            argv = [gf, "server"] if Path(gf).name == "grafana" else [gf]
            if home:
                argv.append(f"--homepath={home}")
            svcs.append(Service("grafana", argv, f"{c.url('grafana')}/api/health", env={
                "GF_PATHS_PROVISIONING": str((c.deploy_dir / "grafana/provisioning").resolve()),
                "GF_PATHS_DATA": str((self.state_dir / "grafana").resolve()),
                "GF_PATHS_LOGS": str((self.state_dir / "logs").resolve()),
                "GF_SERVER_HTTP_ADDR": c.bind, "GF_SERVER_HTTP_PORT": str(c.ports["grafana"]),
                "GF_ANALYTICS_REPORTING_ENABLED": "false",
                "DYNAMICCL_PROMETHEUS_URL": c.url("prometheus"),
                "DYNAMICCL_ALERTMANAGER_URL": c.url("alertmanager"),
                "DYNAMICCL_DASHBOARDS_DIR": str(Path(c.dashboards_dir).resolve())}))
        else:
            notes.append("grafana: no grafana/grafana-server binary on PATH; skipped. Dashboards: "
                         f"`dynamiccl dashboards push --url URL --token TOKEN` to an existing Grafana, "
                         f"or import {c.dashboards_dir}/*.json")
        if c.demo:
            svcs.append(Service("simulated-job", _recording_exit(self.state_dir / "simulated-job.rc", py + [
                "simulate", "run", "--scenario", c.demo_scenario,
                "--collector", f"tcp:127.0.0.1:{c.ports['collector-plugin']}",
                "--out", str(self.state_dir / "sim")]), None, oneshot=True))
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
    if "detector" in started:
        lines.append(f"regime changes: {started['detector']['stdout']} (found by `dynamiccl report "
                     f"{c.parquet_dir}`)")
    return lines


def _recording_exit(rc_file: Path, argv: list[str]) -> list[str]:
    """``argv`` run by a shell that writes its exit status to ``rc_file`` (read by ``status`` later, from
    another process that cannot wait() for it)."""
    return ["/bin/sh", "-c", 'rc=0; "$@" || rc=$?; echo "$rc" > "$0"; exit "$rc"', str(rc_file), *argv]


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


def _loopback(host: str) -> bool:
    from dynamiccl.collector.cli import is_loopback
    return is_loopback(host)
