"""``dynamiccl dashboards build|check|push|annotate``.

    dynamiccl dashboards build                 write dynamiccl/dashboards/json/*.json from dynamiccl/dashboards/build.py
    dynamiccl dashboards check                 exit 1 if the committed JSON is not what build.py generates
    dynamiccl dashboards push --url URL --token-file F        upload folder + dashboards to an existing Grafana
    dynamiccl dashboards annotate --url URL --token-file F [--events tcp:127.0.0.1:9467 | --file F.jsonl]
                                               regime changes (detector stream or NDJSON file) → annotations

``--url`` defaults to ``$GRAFANA_URL``; the token comes from ``--token-file``/``$GRAFANA_TOKEN_FILE`` or
``$GRAFANA_TOKEN`` (``--token`` still works, with a warning: argv is visible to every user). Printed URLs
never show a password. Each command's last line is
``key=value`` pairs.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

from dynamiccl.contracts.atomic import atomic_write

__all__ = ["register", "JSON_DIR", "build", "stale"]

log = logging.getLogger("dashboards")
JSON_DIR = Path(__file__).resolve().parent / "json"


def register(sub) -> None:
    p = sub.add_parser("dashboards", help="Grafana dashboards: build/check the JSON, push, annotate",
                       description=__doc__.splitlines()[0])
    s = p.add_subparsers(dest="dashboards_command", metavar="ACTION")
    b = s.add_parser("build", help="generate the dashboard JSON")
    b.add_argument("--out", default=str(JSON_DIR), help=f"directory (default {JSON_DIR})")
    b.set_defaults(func=_build_cmd)
    c = s.add_parser("check", help="fail if the committed JSON is out of date")
    c.add_argument("--dir", default=str(JSON_DIR))
    c.set_defaults(func=_check_cmd)
    for name, helptext in (("push", "upload the dashboards (and their folder) to a Grafana"),
                           ("annotate", "post regime changes as Grafana annotations")):
        q = s.add_parser(name, help=helptext)
        q.add_argument("--url", default=os.environ.get("GRAFANA_URL"), help="Grafana URL (default $GRAFANA_URL)")
        q.add_argument("--token", default=None,
                       help="service-account token; discouraged: argv is visible to every user on the host "
                            "(a warning is printed); use --token-file or $GRAFANA_TOKEN")
        q.add_argument("--token-file", default=os.environ.get("GRAFANA_TOKEN_FILE"),
                       help="file holding the token, mode 600 (default $GRAFANA_TOKEN_FILE)")
        q.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
        if name == "push":
            q.add_argument("--dir", default=str(JSON_DIR), help="dashboard JSON directory")
            q.set_defaults(func=_push_cmd)
        else:
            src = q.add_mutually_exclusive_group()
            src.add_argument("--events", default="tcp:127.0.0.1:9467",
                             help="detector regime-change stream, unix:PATH or tcp:HOST:PORT (default)")
            src.add_argument("--file", help="NDJSON file of regime changes ('-' = stdin) instead of the stream")
            q.set_defaults(func=_annotate_cmd)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def build() -> dict[str, str]:
    try:
        from dynamiccl.dashboards.build import render_all
    except ImportError as exc:
        raise ValueError(f"generating dashboards needs grafana-foundation-sdk==0.0.21 ({exc}); "
                         f"pip install 'grafana-foundation-sdk==0.0.21' (the committed JSON in {JSON_DIR} "
                         f"needs nothing)") from None
    return render_all()


def stale(directory: Path) -> list[str]:
    """Names of files in ``directory`` that differ from (or are missing versus) the generator's output,
    plus stray ``*.json`` files the generator does not produce."""
    want = build()
    out = [n for n, text in want.items()
           if not (directory / n).is_file() or (directory / n).read_text() != text]
    out += sorted(p.name for p in directory.glob("*.json") if p.name not in want)
    return out


def _build_cmd(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    docs = build()
    for name, text in docs.items():
        path = out / name
        if path.is_file() and path.read_text() == text:
            continue
        atomic_write(path, text)
        written += 1
        print(f"wrote {path}")
    print(f"dashboards={len(docs)} written={written} unchanged={len(docs) - written} out={out}")
    return 0


def _check_cmd(args) -> int:
    bad = stale(Path(args.dir))
    for n in bad:
        print(f"out of date: {Path(args.dir) / n}", file=sys.stderr)
    if bad:
        print("run `dynamiccl dashboards build` and commit the JSON", file=sys.stderr)
    print(f"dashboards={len(build())} stale={len(bad)}")
    return 1 if bad else 0


def _need_url(args) -> None:
    if not args.url:
        raise ValueError("--url (or $GRAFANA_URL) is required")
    args.token = _token(args)


def _token(args) -> str | None:
    """--token (warned: visible in argv), else --token-file / $GRAFANA_TOKEN_FILE, else $GRAFANA_TOKEN."""
    from dynamiccl.dashboards.grafana_push import GrafanaError, read_token_file, redact
    if args.token is not None:
        print("dynamiccl dashboards: warning: --token is visible to every user on this host (ps); "
              "use --token-file or $GRAFANA_TOKEN", file=sys.stderr)
        return args.token
    if args.url and redact(args.url) != args.url and args.url != os.environ.get("GRAFANA_URL"):
        print("dynamiccl dashboards: warning: a password in --url is visible to every user on this host (ps); "
              "use $GRAFANA_URL or a token file", file=sys.stderr)
    if args.token_file:
        try:
            return read_token_file(args.token_file)
        except GrafanaError as exc:
            raise ValueError(str(exc)) from None
    return os.environ.get("GRAFANA_TOKEN")


def _push_cmd(args) -> int:
    from dynamiccl.dashboards.grafana_push import GrafanaError, connect, push_dashboards, redact
    _need_url(args)
    d = Path(args.dir)
    files = sorted(d.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no dashboard JSON in {d} (run `dynamiccl dashboards build`)")
    dashboards = {}
    for f in files:
        try:
            dashboards[f.name] = json.loads(f.read_text())
        except ValueError as exc:
            raise ValueError(f"{f}: not valid JSON ({exc})") from None
    try:
        g = connect(args.url, args.token, timeout=args.timeout)
        res = push_dashboards(g, dashboards)
    except GrafanaError as exc:
        print(f"dynamiccl dashboards push: error: {exc}", file=sys.stderr)
        print(f"pushed=0 url={redact(args.url)}")
        return 1
    for name, r in zip(dashboards, res):
        print(f"pushed {name}: {r.get('url', '') if isinstance(r, dict) else r}")
    print(f"pushed={len(res)} folder=dynamiccl url={redact(args.url)}")
    return 0


def _stream_lines(address: str, stop: threading.Event):
    """Lines of a regime-change stream (the shared reader: linear time, lines over 1 MiB discarded and counted);
    reconnects with backoff (1 s → 30 s) while the detector is down."""
    from dynamiccl.collector.config import parse_address
    from dynamiccl.collector.features import connect
    from dynamiccl.contracts.lines import follow
    parse_address(address, key="--events")          # a bad address is an error now, not a retry loop

    def _connect():
        sock = connect(address, timeout=5.0)
        sock.settimeout(1.0)                        # so `stop` is seen while the detector is quiet
        log.info("annotate: connected to %s", address)
        return sock

    return follow(_connect, stop, name=f"annotate: regime-change stream {address}", backoff=(1.0, 30.0),
                  max_line_bytes=1 << 20)


def _annotate_cmd(args) -> int:
    from dynamiccl.dashboards.grafana_push import Annotator, GrafanaError, connect
    _need_url(args)
    try:
        ann = Annotator(connect(args.url, args.token, timeout=args.timeout))
    except GrafanaError as exc:
        print(f"dynamiccl dashboards annotate: error: {exc}", file=sys.stderr)
        return 2
    if args.file:
        fh = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
        with fh:
            ann.run(fh)
    else:
        from dynamiccl.contracts.lifecycle import stop_on_signals
        with stop_on_signals("dashboards") as stop:
            ann.run(_stream_lines(args.events, stop))
    print(f"annotations posted={ann.posted} failed={ann.failed} malformed={ann.malformed}")
    return 0 if ann.failed == 0 else 1
