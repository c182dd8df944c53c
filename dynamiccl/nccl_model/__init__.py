"""NCCL's own model of a job: the topology it searches and the built-in cost model it tunes with.

Product code (the retuner predicts with it) that the simulator also builds on; it imports only the contracts
and numpy, never a stage or the harness.

* :mod:`.topology` — typed job hardware (nodes, GPUs, links, network) and presets.
* :mod:`.cost_model` — NCCL v2.30.7's cost table and default choice (``nccl-cost-model.md`` §1).
"""
from __future__ import annotations

__all__ = ["topology", "cost_model"]
