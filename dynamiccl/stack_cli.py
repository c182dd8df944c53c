"""The ``dynamiccl stack`` command line: up, down, status, rules, kube, webhook (dynamiccl/stack.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


from dynamiccl.rules import render_rule_files
from dynamiccl.stack import Stack, StackConfig, _write_atomic
from dynamiccl.stack import __doc__ as STACK_DOC
from dynamiccl.webhook import AlertWebhook, print_notification

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser("stack", help="run the monitoring stack natively (no Docker)",
                       description=STACK_DOC.splitlines()[0])
    s = p.add_subparsers(dest="stack_command", metavar="ACTION")
    for name, helptext in (("up", "start the stack"), ("down", "stop it"), ("status", "show what runs")):
        q = s.add_parser(name, help=helptext)
        q.add_argument("--state-dir", default=None,
                       help="pids, logs, rendered configs, data (default $DYNAMICCL_STACK_DIR or runs/stack)")
        if name == "up":
            q.add_argument("--demo", action="store_true", help="also run a simulated job (like compose --profile demo)")
            q.add_argument("--scenario", default="demo", help="scenario of the demo job (default: demo)")
            q.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each service")
            q.add_argument("--services", default=None, metavar="A,B",
                           help="start only these (e.g. prometheus,alertmanager,grafana,alert-log on a Slurm "
                                "service node)")
        q.set_defaults(func=_cmd)
    r = s.add_parser("rules", help="render the alert/recording rules with your runbook and Grafana base URLs")
    r.add_argument("--runbook-url", default=None, metavar="URL",
                   help="base URL of the runbooks (replaces docs/runbooks/ in runbook_url annotations)")
    r.add_argument("--grafana-url", default=None, metavar="URL",
                   help="base URL of your Grafana (replaces http://localhost:3000/ in dashboard_url annotations)")
    r.add_argument("--format", choices=("files", "prometheusrule"), default="files",
                   help="rule files into a directory (Prometheus rule_files), or one PrometheusRule manifest")
    r.add_argument("--rules-dir", default=None, help="source rule files (default: the installed deploy/)")
    r.add_argument("--out", required=True, help="directory (files) or file, '-' for stdout (prometheusrule)")
    r.set_defaults(func=_rules_cmd)
    k = s.add_parser("kube", help="regenerate deploy/kubernetes/base/generated/ (PrometheusRule, dashboards)")
    k.add_argument("--check", action="store_true", help="exit 1 if the committed files are stale")
    k.set_defaults(func=_kube_cmd)
    w = s.add_parser("webhook", help="example Alertmanager webhook: print each alert as a JSON line")
    w.add_argument("--listen", default="127.0.0.1:9469", help="HOST:PORT (default 127.0.0.1:9469)")
    w.set_defaults(func=_webhook_cmd)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _cmd(args: argparse.Namespace) -> int:
    only = getattr(args, "services", None)
    cfg = StackConfig.from_env(state_dir=args.state_dir, demo=getattr(args, "demo", False),
                               demo_scenario=getattr(args, "scenario", "demo"),
                               only=tuple(only.split(",")) if only else None)
    stack = Stack(cfg)
    if args.stack_command == "up":
        try:
            return stack.up(timeout=args.timeout)
        except RuntimeError as exc:
            print(f"dynamiccl stack: error: {exc}", file=sys.stderr)
            return 1
    if args.stack_command == "down":
        return stack.down()
    return stack.status()


def _rules_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.rules import PROMETHEUSRULE_HEADER, dump, prometheus_rule
    src = Path(args.rules_dir) if args.rules_dir else StackConfig.from_env().deploy_dir / "prometheus/rules"
    urls = {"runbook_url": args.runbook_url, "grafana_url": args.grafana_url}
    try:
        if args.format == "files":
            written = render_rule_files(src, Path(args.out), **urls)
            print(f"rules=written files={len(written)} out={args.out}")
            return 0
        text = PROMETHEUSRULE_HEADER + dump(prometheus_rule(src, **urls))
    except (ValueError, OSError) as exc:
        print(f"dynamiccl stack rules: error: {exc}", file=sys.stderr)
        return 1
    if args.out == "-":
        sys.stdout.write(text)
    else:
        _write_atomic(Path(args.out), text)
        print(f"rules=written format=prometheusrule out={args.out}")
    return 0


def _kube_cmd(args: argparse.Namespace) -> int:
    from dynamiccl import kube
    if args.check:
        bad = kube.stale()
        for name in bad:
            print(f"stale: {kube.GENERATED_DIR / name} (run `dynamiccl stack kube`)", file=sys.stderr)
        print(f"kube=checked stale={len(bad)}")
        return 1 if bad else 0
    paths = kube.write()
    print(f"kube=written files={len(paths)} out={kube.GENERATED_DIR}")
    return 0


def _webhook_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.collector.config import parse_host_port
    from dynamiccl.contracts.lifecycle import ServiceRun, run_service
    host, port = parse_host_port(args.listen, key="--listen")

    def start() -> AlertWebhook:
        try:
            return AlertWebhook(host, port, on_notification=print_notification).start()
        except OSError as exc:
            raise OSError(f"{args.listen}: {exc.strerror or exc}") from exc

    return run_service(ServiceRun(
        "stack webhook", start, ready=lambda hook: f"alert webhook listening on http://{hook.address}/alerts",
        stop=lambda hook: hook.shutdown(),
        stopped=lambda hook: f"webhook=stopped received={hook.received} rejected={hook.rejected}"))
