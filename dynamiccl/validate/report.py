"""``report.json`` and ``report.md`` of a validation run (written atomically)."""
from __future__ import annotations

import json
import os

from dynamiccl.contracts.atomic import atomic_write

from .checks import Check

__all__ = ["write_reports", "render_md"]


_atomic = atomic_write


def render_md(env: dict, checks: list[Check]) -> str:
    ok = all(c.ok is not False for c in checks)
    lines = [f"# DynamICCL on real NCCL: {'PASS' if ok else 'FAIL'}", "",
             f"- date: {env.get('date', '?')}", f"- GPU: {env.get('gpu', '?')}",
             f"- NCCL {env.get('nccl', '?')}, PyTorch {env.get('torch', '?')}",
             f"- ranks: {env.get('ranks', '?')} ({env.get('plan_note') or 'one rank per GPU'})",
             f"- command: `{env.get('command', '?')}` ({env.get('wall_s', 0):.0f} s)", "",
             "| check | result | numbers |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.status} | {c.summary.replace('|', '/')} |" for c in checks]
    for c in checks:
        if c.details:
            lines += ["", f"## {c.name}", ""] + [f"- {d}" for d in c.details]
    timing = next((c.numbers.get("timing") for c in checks if c.name.startswith("2")), None)
    if timing:
        lines += ["", "## Profiler GPU time vs CUDA events (median per cell, us)", "",
                  "| collective | bytes | profiler | CUDA events | within tolerance |", "|---|---|---|---|---|"]
        lines += [f"| {r['func']} | {r['bytes']} | {r['profiler_us']} | {r['cuda_us']} | {r['ok']} |" for r in timing]
    return "\n".join(lines) + "\n"


def write_reports(out: str, env: dict, checks: list[Check]) -> bool:
    ok = all(c.ok is not False for c in checks)
    doc = {"ok": ok, "env": env, "checks": [{"name": c.name, "status": c.status, "summary": c.summary,
                                              "numbers": c.numbers, "details": c.details} for c in checks]}
    _atomic(os.path.join(out, "report.json"), json.dumps(doc, indent=1, default=str) + "\n")
    _atomic(os.path.join(out, "report.md"), render_md(env, checks))
    return ok
