"""``dynamiccl testbed``: real collectives on a real (namespaced) network with real congestion.

``run --scenario ci|tour|FILE.yaml`` builds the namespaces, starts the ranks, the collector and
the detector, plays the scenario and ends with one line
``changes=… detected=… false_alarms=… max_delay_s=… localised=…``. ``cleanup`` removes what
runs that died (SIGKILL) left behind; ``list`` shows runs known to this host. Needs root and
iproute2; without them it prints why and exits 3.
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["register", "run", "cleanup", "list_cmd"]

EXIT_UNAVAILABLE = 3


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("testbed", help="network-namespace congestion test bed (root, iproute2)",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="testbed_command", metavar="ACTION")
    r = sub.add_parser("run", help="run a scenario live and score the detector")
    r.add_argument("--scenario", default="ci", help="ci, tour, or a YAML file (default ci)")
    r.add_argument("--out", default=None, help="output directory (default runs/testbed/<prefix>)")
    r.add_argument("--quiet", action="store_true", help="only changes, detections and the last line")
    r.add_argument("--check", action="store_true",
                   help="exit 1 unless every change is detected within 3 s, no false alarm, all localised")
    r.set_defaults(func=run)
    c = sub.add_parser("cleanup", help="remove namespaces/links of dead runs (and dtbXXXX orphans)")
    c.add_argument("--prefix", default=None, help="only this run (dtbXXXX), even if its owner is alive")
    c.add_argument("--force", action="store_true", help="also runs whose owner is still alive")
    c.set_defaults(func=cleanup)
    ls = sub.add_parser("list", help="runs with a state file on this host")
    ls.set_defaults(func=list_cmd)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    return p


def run(args: argparse.Namespace) -> int:
    from dynamiccl.harness.testbed.netns import TestbedUnavailable
    from dynamiccl.harness.testbed.run import run_scenario
    from dynamiccl.harness.testbed.scenario import load
    scenario = load(args.scenario)  # ValueError → "dynamiccl testbed: error: ..." exit 2
    try:
        res = run_scenario(scenario, out_dir=args.out, live=not args.quiet)
    except TestbedUnavailable as exc:
        print(f"dynamiccl testbed: unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    sc = res.score
    print(f"{'change':<44} {'detected as':<28} {'delay':>7}")
    for row in sc.rows:
        got = f"{row['kind']} {row.get('ranks') or ''}" if row["detected"] else "MISSED"
        delay = f"{row['delay_s']:.2f}s" if row["detected"] else "-"
        loc = "" if "localised" not in row else ("  localised" if row["localised"] else "  NOT localised")
        print(f"{row['description']:<44} {got:<28} {delay:>7}{loc}")
    for fa in sc.false:
        d = fa["detection"]
        print(f"false alarm: {d['id']} {d['kind']} ranks={d['ranks']} ({fa['why']})")
    print(f"records={res.records} windows={res.windows} out={res.out_dir}")
    print(sc.line(), flush=True)
    if res.interrupted:
        return 130
    return 1 if args.check and not sc.meets() else 0


def cleanup(args: argparse.Namespace) -> int:
    from dynamiccl.harness.testbed.netns import TestbedUnavailable, check_available, cleanup as do_cleanup
    try:
        check_available()
    except TestbedUnavailable as exc:
        print(f"dynamiccl testbed: unavailable: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    removed = do_cleanup(args.prefix, force=args.force)
    print(f"removed {len(removed)}: {' '.join(removed) if removed else '-'}")
    return 0


def list_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.harness.testbed.netns import list_runs
    runs = list_runs()
    for st in runs:
        print(f"{st['prefix']} pid={st['pid']} {'alive' if st['alive'] else 'DEAD (dynamiccl testbed cleanup)'} "
              f"netns={len(st.get('netns', []))} links={len(st.get('links', []))}")
    if not runs:
        print("no test-bed runs")
    return 0
