"""The retuner: regime changes in, NCCL tuner configurations out — safely.

One role, one small interface (:class:`Retuner`): ``on_change(RegimeChange)``, ``on_window(WindowFeatures)``
or ``observe([Observation])``; each returns the tuner-config version it wrote (or None). Modules:

* :mod:`dynamiccl.retuner.config` — typed, validated configuration (dry run by default, allow/deny lists, pins, policy);
* :mod:`dynamiccl.retuner.agent` — :class:`Retuner`: attribution of measurements, triggers, budget, pushes, audit;
* :mod:`dynamiccl.retuner.explore` — one bounded exploration (sequential tests, parallel over equivalent comms);
* :mod:`dynamiccl.retuner.planner`, :mod:`dynamiccl.retuner.model` — candidates from NCCL's cost model refitted to measurements;
* :mod:`dynamiccl.retuner.memory` — what worked per regime fingerprint; :mod:`dynamiccl.retuner.stats` — merged batches, Welch tests;
* :mod:`dynamiccl.retuner.push` — atomic, versioned tuner config file; :mod:`dynamiccl.retuner.audit` — JSON-lines audit log;
* :mod:`dynamiccl.retuner.metrics` — Prometheus metrics; :mod:`dynamiccl.retuner.service` / :mod:`dynamiccl.retuner.cli` — ``dynamiccl retuner``;
* :mod:`dynamiccl.harness.retuner_eval` — ``dynamiccl retuner evaluate`` in the simulator.
"""
from __future__ import annotations

__all__ = ["Retuner", "RetunerConfig", "PolicyConfig", "Pin", "Observation", "Target", "Candidate"]


def __getattr__(name: str):
    if name == "Retuner":
        from dynamiccl.retuner.agent import Retuner
        return Retuner
    if name in ("RetunerConfig", "PolicyConfig", "Pin"):
        import dynamiccl.retuner.config as c
        return getattr(c, name)
    if name in ("Observation", "Target", "Candidate"):
        import dynamiccl.retuner.types as t
        return getattr(t, name)
    raise AttributeError(f"module 'retuner' has no attribute {name!r}")
