"""What ``dynamiccl stack up`` starts: one builder per service (its command line, health URL and
environment, or None and a note saying why it is skipped), and Grafana's admin password."""
from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.stack_config import AUDIT_FILE, CHANGES_FILE, StackConfig

__all__ = ["GRAFANA_PASSWORD_FILE", "Service", "grafana_admin_password"]


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



# ---- one builder per service: (the Service, or None and a note saying why it is skipped) ----
_Planned = tuple["Service | None", "str | None"]


def _collector(c: StackConfig, py: list[str], state_dir: Path) -> _Planned:
    return Service("collector", py + [
        "collector", "--listen", f"unix:{state_dir.resolve() / 'dynamiccl.sock'}",
        "--listen", f"tcp:{c.address('collector-plugin')}", "--metrics", c.address("collector"),
        "--features", f"tcp:{c.address('collector-features')}", "--parquet", str(c.parquet_dir)]
        + ([] if _loopback(c.bind) else ["--allow-remote"]),  # DYNAMICCL_BIND set: remote was asked for
        f"{c.url('collector')}/metrics"), None


def _detector(c: StackConfig, py: list[str]) -> _Planned:
    # its stdout is the change log (one RegimeChange JSON per line), read by `dynamiccl report`
    return Service("detector", py + [
        "detector", "run", "--features", f"tcp:{c.address('collector-features')}", "--metrics", c.address("detector"),
        "--serve", f"tcp:{c.address('detector-events')}"],
        f"{c.url('detector')}/metrics", stdout=c.run_dir / CHANGES_FILE), None


def _retuner(c: StackConfig, py: list[str]) -> _Planned:
    return Service("retuner", py + [
        "retuner", "run", "--changes", f"tcp:{c.address('detector-events')}", "--features",
        f"tcp:{c.address('collector-features')}", "--metrics", c.address("retuner"),
        "--audit", str(c.run_dir / AUDIT_FILE)], f"{c.url('retuner')}/metrics"), None


def _alert_log(c: StackConfig, py: list[str]) -> _Planned:
    return Service("alert-log", py + ["stack", "webhook", "--listen", c.address("alert-log")],
                   f"{c.url('alert-log')}/"), None


def _alertmanager(c: StackConfig, config_file: Path, state_dir: Path) -> _Planned:
    am = _find("prometheus-alertmanager", "alertmanager")
    if not am:
        return None, ("alertmanager: no prometheus-alertmanager/alertmanager binary on PATH "
                      "(Debian: apt-get install prometheus-alertmanager); skipped")
    return Service("alertmanager", [
        am, f"--config.file={config_file}", f"--storage.path={state_dir / 'alertmanager'}",
        f"--web.listen-address={c.address('alertmanager')}", "--cluster.listen-address=",
        f"--web.external-url={c.url('alertmanager')}"], f"{c.url('alertmanager')}/-/ready"), None


def _prometheus(c: StackConfig, config_file: Path, state_dir: Path) -> _Planned:
    prom = _find("prometheus")
    if not prom:
        return None, "prometheus: no prometheus binary on PATH (Debian: apt-get install prometheus)"
    return Service("prometheus", [
        prom, f"--config.file={config_file}", f"--storage.tsdb.path={state_dir / 'prometheus'}",
        f"--web.listen-address={c.address('prometheus')}", f"--web.external-url={c.url('prometheus')}"],
        f"{c.url('prometheus')}/-/ready"), None   # no --web.enable-lifecycle: /-/quit and /-/reload stay closed


GRAFANA_PASSWORD_FILE = "grafana-admin-password"


def grafana_admin_password(state_dir: Path, env=os.environ) -> str:
    """Grafana's admin password: ``GRAFANA_ADMIN_PASSWORD`` if set, else a random one generated once per
    stack and kept in ``STATE_DIR/grafana-admin-password`` (0600). Never Grafana's admin/admin default."""
    if env.get("GRAFANA_ADMIN_PASSWORD"):
        return env["GRAFANA_ADMIN_PASSWORD"]
    path = Path(state_dir) / GRAFANA_PASSWORD_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pw = secrets.token_urlsafe(18)
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        atomic_write(path, pw + "\n", mode=0o600)
        return pw


def _grafana(c: StackConfig, state_dir: Path) -> _Planned:
    gf = _find("grafana", "grafana-server")
    if not gf:
        return None, ("grafana: no grafana/grafana-server binary on PATH; skipped. Dashboards: "
                      f"`dynamiccl dashboards push --url URL --token TOKEN` to an existing Grafana, "
                      f"or import {c.dashboards_dir}/*.json")
    home = next((p for p in ("/usr/share/grafana", "/usr/local/share/grafana") if Path(p).is_dir()), None)
    argv = [gf, "server"] if Path(gf).name == "grafana" else [gf]
    if home:
        argv.append(f"--homepath={home}")
    return Service("grafana", argv, f"{c.url('grafana')}/api/health", env={
        "GF_PATHS_PROVISIONING": str((c.deploy_dir / "grafana/provisioning").resolve()),
        "GF_PATHS_DATA": str((state_dir / "grafana").resolve()),
        "GF_PATHS_LOGS": str((state_dir / "logs").resolve()),
        "GF_SERVER_HTTP_ADDR": c.bind, "GF_SERVER_HTTP_PORT": str(c.ports["grafana"]),
        "GF_ANALYTICS_REPORTING_ENABLED": "false",
        "GF_SECURITY_ADMIN_PASSWORD": grafana_admin_password(state_dir),
        "DYNAMICCL_PROMETHEUS_URL": c.url("prometheus"),
        "DYNAMICCL_ALERTMANAGER_URL": c.url("alertmanager"),
        "DYNAMICCL_DASHBOARDS_DIR": str(Path(c.dashboards_dir).resolve())}), None


def _demo_job(c: StackConfig, py: list[str], state_dir: Path) -> _Planned:
    if not c.demo:
        return None, None
    return Service("simulated-job", _recording_exit(state_dir / "simulated-job.rc", py + [
        "simulate", "run", "--scenario", c.demo_scenario,
        "--collector", f"tcp:127.0.0.1:{c.ports['collector-plugin']}",
        "--out", str(state_dir / "sim")]), None, oneshot=True), None


def _recording_exit(rc_file: Path, argv: list[str]) -> list[str]:
    """``argv`` run by a shell that writes its exit status to ``rc_file`` (read by ``status`` later, from
    another process that cannot wait() for it)."""
    return ["/bin/sh", "-c", 'rc=0; "$@" || rc=$?; echo "$rc" > "$0"; exit "$rc"', str(rc_file), *argv]


def _loopback(host: str) -> bool:
    from dynamiccl.collector.cli import is_loopback
    return is_loopback(host)
