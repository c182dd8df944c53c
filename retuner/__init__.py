"""The retuner: regime changes in, NCCL tuner configurations out — safely.

One role, one small interface (:class:`Retuner`): ``on_change(RegimeChange)``, ``on_window(WindowFeatures)``
or ``observe([Observation])``; each returns the tuner-config version it wrote (or None). Modules:

* :mod:`retuner.config` — typed, validated configuration (dry run by default, allow/deny lists, pins, policy);
* :mod:`retuner.agent` — :class:`Retuner`: attribution of measurements, triggers, budget, pushes, audit;
* :mod:`retuner.explore` — one bounded exploration (sequential tests, parallel over equivalent comms);
* :mod:`retuner.planner`, :mod:`retuner.model` — candidates from NCCL's cost model refitted to measurements;
* :mod:`retuner.memory` — what worked per regime fingerprint; :mod:`retuner.stats` — merged batches, Welch tests;
* :mod:`retuner.push` — atomic, versioned tuner config file; :mod:`retuner.audit` — JSON-lines audit log;
* :mod:`retuner.metrics` — Prometheus metrics; :mod:`retuner.service` / :mod:`retuner.cli` — ``dynamiccl retuner``;
* :mod:`retuner.evaluation` — ``dynamiccl retuner evaluate`` in the simulator.
"""
from __future__ import annotations

__all__ = ["Retuner", "RetunerConfig", "PolicyConfig", "Pin", "Observation", "Target", "Candidate"]


def __getattr__(name: str):
    if name == "Retuner":
        from retuner.agent import Retuner
        return Retuner
    if name in ("RetunerConfig", "PolicyConfig", "Pin"):
        import retuner.config as c
        return getattr(c, name)
    if name in ("Observation", "Target", "Candidate"):
        import retuner.types as t
        return getattr(t, name)
    raise AttributeError(f"module 'retuner' has no attribute {name!r}")
