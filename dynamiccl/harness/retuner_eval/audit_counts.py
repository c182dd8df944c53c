"""Counts over the decisions of ``dynamiccl retuner evaluate --json PATH``: the issue-21 audit checks.

    python -m dynamiccl.harness.retuner_eval.audit_counts RUN.json [...]

Per file: decisions by action, round-1 plans ranked by the learned policy, how many of those carry the policy's
action values (its reasons), fallbacks to the model-guided plan, and ``unapplicable`` decisions (a pushed cell the
job could not run — NCCL disabled it — is seen as not applied and marked so; 0 means no −1 cell was pushed).
"""
from __future__ import annotations

import collections
import json
import sys

__all__ = ["counts"]


def counts(report: dict) -> dict:
    actions: collections.Counter = collections.Counter()
    learned = with_values = fallback = 0
    for r in report.get("results", []):
        for a in r.get("decisions", []):
            actions[a.get("action")] += 1
            info = a.get("learned")
            if info is not None:
                learned += 1
                with_values += bool(info.get("action_values"))
                fallback += "fallback" in info
    return {"decisions": sum(actions.values()), "learned_ranked": learned, "with_action_values": with_values,
            "fallback": fallback, "unapplicable": actions.get("unapplicable", 0), "actions": dict(actions)}


def main(argv: list[str]) -> int:
    for path in argv:
        with open(path, encoding="utf-8") as fh:
            c = counts(json.load(fh))
        print(path, " ".join(f"{k}={v}" for k, v in c.items() if k != "actions"), json.dumps(c["actions"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
