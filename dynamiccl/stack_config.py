"""Where the native stack listens and keeps its files, and the deploy/ configuration rendered for it.

:class:`StackConfig` holds the ports (from the same environment variables as ``compose.yaml``,
:data:`PORT_ENV`), the state and parquet directories and the deploy/ and dashboards directories.
:func:`render_prometheus` and :func:`render_alertmanager` rewrite the compose addresses of ``deploy/``
(``collector:9464``...) into the native stack's and change nothing else.

>>> StackConfig.from_env({"COLLECTOR_METRICS_PORT": "19464"}).url("collector")
'http://127.0.0.1:19464'
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

__all__ = ["StackConfig", "PORT_ENV", "COMPOSE_ADDRESSES", "render_prometheus", "render_alertmanager",
           "DEFAULT_DEPLOY_DIR", "DEFAULT_DASHBOARDS_DIR", "DEFAULT_RUNBOOK_URL", "CHANGES_FILE", "AUDIT_FILE"]

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


# ---- configuration rendering: the deploy/ files with compose addresses replaced by loopback ones ----
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
