"""The retuner's part of the demo, measured: where the simulator's oracle says a better config than NCCL's
default exists, what the job measured with NCCL's default and with the config the retuner kept, how much of the
oracle's gain that captured over the whole regime, and when it reverted after the regime ended.

The oracle is the one ``dynamiccl retuner evaluate`` scores against (:class:`dynamiccl.harness.retuner_eval.truth.Truth`:
every enabled cell × a channel grid, noise-free expected times on the communicator's nodes and ranks). The
measurements are the collector's windows (:class:`~dynamiccl.demo.history.History`): per config, the summed
latency × instances of the stream's communicators in the windows wholly inside the regime.
"""
from __future__ import annotations

import math

from dynamiccl.demo.history import History, family

__all__ = ["oracle_regimes", "measure", "GAIN_FLOOR"]

#: an oracle gain below this (over the stream's own gain at the baseline) is "nothing to gain" (as in
#: dynamiccl.harness.retuner_eval.suite: 1 %)
GAIN_FLOOR = 0.01
_NETWORK = ("bw_drop", "latency", "incast", "flap", "degrading_nic")


def _cfg_name(cfg) -> str:
    from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS

    return f"{ALGOS[cfg[0]]}/{PROTOS[cfg[1]]}"


def _bucket(nbytes: int) -> int:
    return int(math.frexp(nbytes)[1]) - 1


def oracle_regimes(workload: str, scenario: str, duration_s: float, truth: list[dict]) -> list[dict]:
    """Per network regime of the ground truth and per stream: NCCL's default and the oracle's best config and
    expected times. ``better`` marks the streams where the regime itself opens a gain (≥ GAIN_FLOOR over the
    stream's oracle gain at the baseline, which a regime-driven retuner does not chase)."""
    from dynamiccl.harness.retuner_eval.truth import Truth
    from dynamiccl.harness.simulator.scenario import load as load_scenario
    from dynamiccl.harness.simulator.workload import load as load_workload

    w, sc = load_workload(workload), load_scenario(scenario)
    tr = Truth(w, sc, duration_s)
    base = tr.baseline_state()
    out = []
    for ev in truth:
        if ev["kind"] not in _NETWORK or ev.get("benign"):
            continue
        state = sc.state_at((ev["t_start"] + ev["t_end"]) / 2, w.topology)
        seen = set()
        for op in tr.ops:
            stream = (family(op.comm.name), op.func, _bucket(op.nbytes))
            if stream in seen:
                continue
            seen.add(stream)
            d = tr.default_cfg(op)
            (best, best_t), d_t = tr.best(op, state), tr.time_us(op, d, state)
            base_gain = tr.time_us(op, d, base) / tr.best(op, base)[1]
            out.append({"event": ev["id"], "kind": ev["kind"], "t_start": ev["t_start"], "t_end": ev["t_end"],
                        "stream": list(stream), "default": _cfg_name(d), "default_us": d_t,
                        "best": _cfg_name(best), "best_channels": best[2], "best_us": best_t,
                        "oracle_gain": d_t / best_t, "better": d_t / best_t >= base_gain + GAIN_FLOOR})
    return out


def _mean(stream, t0: float, t1: float, want) -> tuple[float | None, int]:
    busy = n = 0
    for t, by in zip(stream.t, stream.by_cfg):
        if t0 <= t and t + 1.0 <= t1:
            for cfg, (b, k) in by.items():
                if want(cfg, t):
                    busy += b
                    n += k
    return (busy / n if n else None), n


def _target_stream(target: str) -> tuple[str, str, int] | None:
    parts = (target or "").split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return family(parts[0]), parts[1], int(parts[2])


def measure(regime: dict, history: History, audit: list[dict], epoch_s: float) -> dict:
    """What the job measured in one regime where the oracle gains (see module docstring)."""
    key = tuple(regime["stream"])
    stream = history.streams.get(key)
    t0, t1 = regime["t_start"], regime["t_end"]
    mine = [a for a in audit if _target_stream(a.get("target", "")) == key and isinstance(a.get("t"), (int, float))]
    keep = next((a for a in mine if a.get("action") in ("keep", "reuse") and t0 <= a["t"] - epoch_s < t1
                 and a.get("candidate") not in (None, "NCCL-default")), None)
    revert = next((a for a in mine if a.get("action") == "revert" and a["t"] - epoch_s >= t1 - 1.0), None)
    row = {**regime, "kept": keep.get("candidate") if keep else None,
           "kept_at_s": keep["t"] - epoch_s if keep else None,
           "retuner_gain": keep.get("gain") if keep else None,
           "reverted_at_s": revert["t"] - epoch_s if revert else None,
           "revert_to": (revert.get("config") or revert.get("now")) if revert else None}
    if stream is None:
        return row
    default = regime["default"]
    kept_cell = "/".join(row["kept"].split("/")[:2]) if row["kept"] else None
    d_mean, d_n = _mean(stream, t0, t1, lambda cfg, t: cfg == default)
    k_mean, k_n = (_mean(stream, t0, t1, lambda cfg, t: cfg == kept_cell and t >= row["kept_at_s"])
                   if kept_cell else (None, 0))
    all_mean, _ = _mean(stream, t0, t1, lambda cfg, t: True)
    row.update(default_measured_s=d_mean, default_instances=d_n, kept_measured_s=k_mean, kept_instances=k_n,
               regime_measured_s=all_mean)
    if d_mean and k_mean:
        row["measured_gain"] = d_mean / k_mean
    oracle_saving = 1.0 - regime["best_us"] / regime["default_us"]
    if d_mean and all_mean and oracle_saving > 0:
        # the share of the oracle's saving the job got over the WHOLE regime (detection and exploration included)
        row["captured"] = (1.0 - all_mean / d_mean) / oracle_saving
    back = next((s for s in stream.switches if s[0] >= t1 - 1.0 and s[2] == default), None)
    row["default_again_at_s"] = back[0] if back else None
    return row
