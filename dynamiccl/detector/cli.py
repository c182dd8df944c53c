"""``dynamiccl detector run|evaluate``.

``run``: read the collector's feature stream, serve regime changes (NDJSON), export metrics,
log each change as a JSON line on stdout, post Grafana annotations when a URL is given. Start-up
errors (bad address, port in use) print one line and exit non-zero; after start-up nothing is
fatal (the collector may come and go). ``evaluate``: see `dynamiccl.harness.detector_eval_cli`.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

__all__ = ["register", "detector_config_from_args"]

log = logging.getLogger("detector")
_OFF = ("off", "none", "")


def register(subparsers) -> argparse.ArgumentParser:
    from .config import DEFAULT_FEATURES, DEFAULT_METRICS, DEFAULT_SERVE
    p = subparsers.add_parser("detector", help="detect regime changes in the collector's feature stream",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="detector_command", metavar="{run,evaluate}")
    r = sub.add_parser("run", help="run the detector service")
    r.add_argument("--features", default=DEFAULT_FEATURES, metavar="ADDR",
                   help=f"collector feature stream, unix:PATH or tcp:HOST:PORT (default {DEFAULT_FEATURES})")
    r.add_argument("--metrics", default=DEFAULT_METRICS, metavar="HOST:PORT",
                   help=f"/metrics address (default {DEFAULT_METRICS}); 'off' to disable")
    r.add_argument("--serve", default=DEFAULT_SERVE, metavar="ADDR",
                   help=f"regime-change stream (NDJSON) address (default {DEFAULT_SERVE}); 'off' to disable")
    r.add_argument("--grafana-url", default=os.environ.get("DYNAMICCL_GRAFANA_URL"),
                   help="post each change as a Grafana annotation (env DYNAMICCL_GRAFANA_URL)")
    r.add_argument("--grafana-token", default=os.environ.get("DYNAMICCL_GRAFANA_TOKEN"),
                   help="Grafana service-account token (env DYNAMICCL_GRAFANA_TOKEN)")
    r.add_argument("--arl0", type=float, default=None, help="windows between false alarms per stream (default 1e5)")
    r.add_argument("--warmup", type=int, default=None, help="baseline windows per stream (default 60)")
    r.add_argument("--no-autoencoder", action="store_true", help="run without the torch autoencoder")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any detector setting by dotted key (repeatable), e.g. --set baseline.warmup=30; "
                        "in a config file a nested mapping: detector: {run: {set: {baseline: {warmup: 30}}}}")
    r.set_defaults(func=run)
    e = sub.add_parser("evaluate", help="score the detector on simulated scenarios (ground truth)")
    from dynamiccl.harness.detector_eval_cli import add_arguments
    add_arguments(e)
    e.set_defaults(func=_evaluate)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    return p


def _evaluate(args) -> int:
    from dynamiccl.harness.detector_eval_cli import run as run_eval
    return run_eval(args)


def annotation_sink(url: str | None, token: str | None):
    """The service's Grafana annotations, composed here so the detector needs nothing from the views layer;
    None without a URL. ValueError for a token without a URL or a URL that is not one; a Grafana client that
    cannot be built logs one line and leaves annotations off (the detector runs without them)."""
    if url is None:
        if token is not None:
            raise ValueError("--grafana-token needs --grafana-url")
        return None
    if "://" not in url:
        raise ValueError(f"--grafana-url: expected http(s)://HOST:PORT, got {url!r}")
    from dynamiccl.dashboards.grafana_push import GrafanaError, annotation_sink as grafana_sink
    try:
        return grafana_sink(url, token)
    except GrafanaError as exc:
        log.warning("Grafana annotations disabled: %s", exc)
        return None


def detector_config_from_args(args: argparse.Namespace):
    """``--set`` items, then the named flags (``--arl0``, ``--warmup``, ``--no-autoencoder``) over them; validated."""
    from .config import DetectorConfig, parse_overrides
    overrides = parse_overrides(args.set)
    if args.arl0 is not None:
        overrides["cusum.arl0"] = args.arl0
    if args.warmup is not None:
        overrides["baseline.warmup"] = args.warmup
    if args.no_autoencoder:
        overrides["autoencoder.enabled"] = False
    return DetectorConfig().with_overrides(overrides)


def run(args: argparse.Namespace) -> int:
    from dynamiccl.contracts.lifecycle import ServiceRun, run_service

    from .runner import DetectorService, ServiceConfig
    off = lambda v: None if v is None or v.lower() in _OFF else v  # noqa: E731
    detector_config = detector_config_from_args(args)
    cfg = ServiceConfig(features=args.features, metrics=off(args.metrics), serve=off(args.serve)).validate()
    annotate = annotation_sink(args.grafana_url or None, args.grafana_token or None)

    def ready(svc) -> str:
        a = svc.addresses
        return (f"detector ready: features={a.get('features')} metrics={a.get('metrics') or '-'} "
                f"serve={a.get('serve') or '-'} grafana={'on' if annotate is not None else 'off'}")

    def stopped(svc) -> str:
        m = svc.metrics
        return (f"detector stopped: windows={m.value('dynamiccl_detector_windows_received_total'):.0f} "
                f"changes={m.value('dynamiccl_detector_changes_emitted_total'):.0f}")

    # stdout carries the changes as JSON lines: the service's own lines go to stderr
    return run_service(ServiceRun("detector", lambda: DetectorService(cfg, detector_config, annotate=annotate).start(),
                                  ready=ready, stop=lambda svc: svc.shutdown(), stopped=stopped, out=sys.stderr))
