"""DynamICCL simulator: NCCL's cost model, a "reality" performance model, calibration and an oracle.

Modules: :mod:`dynamiccl.harness.simulator.topology` (job hardware + presets), :mod:`dynamiccl.harness.simulator.cost_model` (NCCL v2.30.7's
built-in model: the tuner cost table and default choice), :mod:`dynamiccl.harness.simulator.perf_model` (collective durations
on a :class:`~dynamiccl.harness.simulator.perf_model.NetworkState`), :mod:`dynamiccl.harness.simulator.calibration` (published busbw points) and
:mod:`dynamiccl.harness.simulator.oracle` (best config per size under the performance model). Pure numpy, deterministic.
"""

__all__ = ["topology", "cost_model", "perf_model", "calibration", "oracle"]
