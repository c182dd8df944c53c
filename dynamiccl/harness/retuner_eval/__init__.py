"""``dynamiccl retuner evaluate``: the retuner against NCCL's default, tune-once and the oracle, in the simulator.

* :mod:`.sim_tuner` — tuners the simulator's :class:`~dynamiccl.harness.simulator.engine.Engine` calls (the reference Python
  application of the tuner config file, and fixed per-regime configs for the baselines).
* :mod:`.truth` — what is really best: candidate enumeration under the simulator's performance model, the
  per-regime oracle, and regime changes derived from the scenario's ground truth.
* :mod:`.runner` — one (workload, scenario, policy) run, and the per-run measurements.
* :mod:`.suite` — the suite, the table and the machine-readable last line.
"""
