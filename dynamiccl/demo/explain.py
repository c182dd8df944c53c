"""Which detected changes the retuner's own configs explain, by the ground truth.

The detector keys its streams by communicator, collective and size, not by the config that ran, so it also sees
a level set by a config the retuner put in force: when a regime ends while the regime's config still runs, the
detector's recovery puts its reference back to the baseline it learned under NCCL's default, and the kept config's
own cost at the baseline (e.g. Ring/LL128 with 2 channels, 1.09x Ring/Simple's time on the idle network) shows as a
change until the revert lands. A change that matches no true network change is *explained by our config* when, at
its onset, the records show a config other than NCCL's default running on its streams and the simulator's model
(the oracle's expected times, :class:`dynamiccl.harness.retuner_eval.truth.Truth`) gives that config's time against NCCL's
default, under the true network state at the onset, within ``TOLERANCE`` of the detected magnitude; a recovery of
an explained change is explained too. A *straggler* change is explained by our config when, at its onset, a
communicator holding one of its ranks ran a config other than NCCL's default that the model makes at least
``SLOW`` times slower (a probe: its ranks arrive late at their next collective on the other communicators). Everything
else stays *unmatched*.
"""
from __future__ import annotations

import math
from pathlib import Path

__all__ = ["explain_by_config", "TOLERANCE"]

TOLERANCE = 0.03
SLOW = 1.10             # the retuner's hysteresis (PolicyConfig.min_change): a smaller slowdown is not a change


def _probe_made_ranks_late(c, tr, w, sc, parquet_dir: Path, epoch_s: float) -> dict | None:
    from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS

    ranks = set(c.ranks or ())
    comms = {x.name for x in w.comms if ranks & set(x.ranks)}
    running = _configs_at(parquet_dir, comms, int((c.start_s - 1.0) * 1e9), int((c.start_s + 1.0) * 1e9),
                          min_share=0.1)
    state = sc.state_at(c.start_s - epoch_s, w.topology)
    ops = {op.comm.name: op for op in tr.ops if op.comm.name in comms}
    for name, cfg in running:
        op = ops.get(name)
        if op is None:
            continue
        default = tr.default_cfg(op)
        r = tr.time_us(op, cfg, state) / tr.time_us(op, default, state)
        if r >= SLOW:
            return {"config": f"{ALGOS[cfg[0]]}/{PROTOS[cfg[1]]}/{cfg[2]} on {op.comm.name}", "model_ratio": r,
                    "magnitude": c.magnitude}
    return None


def _configs_at(parquet_dir: Path, names: set[str], t0_ns: int, t1_ns: int,
                min_share: float | None = None) -> dict[str, tuple[int, int, int]] | list[tuple[str, tuple]]:
    """Per communicator name: the (algo, proto, channels) most of its records ran in [t0, t1); with
    ``min_share``, every (name, config) that ran at least that share of the name's records there."""
    import polars as pl

    files = sorted(str(p) for p in Path(parquet_dir).rglob("*.parquet"))
    if not files:
        return {}
    df = (pl.scan_parquet(files)
          .filter((pl.col("kind") == 1) & pl.col("gpu_start_ns").is_between(t0_ns, t1_ns, closed="left"))
          .with_columns(pl.col("comm_name").cast(pl.String))
          .filter(pl.col("comm_name").is_in(sorted(names)))
          .group_by("comm_name", "algo", "proto", "n_channels").agg(pl.len().alias("n"))
          .sort("n", descending=True).collect())
    if min_share is not None:
        totals = {n: int(df.filter(pl.col("comm_name") == n)["n"].sum()) for n in set(df["comm_name"].to_list())}
        return [(r["comm_name"], (int(r["algo"]), int(r["proto"]), int(r["n_channels"])))
                for r in df.iter_rows(named=True) if r["n"] >= min_share * totals[r["comm_name"]]]
    out: dict[str, tuple[int, int, int]] = {}
    for r in df.iter_rows(named=True):
        out.setdefault(r["comm_name"], (int(r["algo"]), int(r["proto"]), int(r["n_channels"])))
    return out


def explain_by_config(changes: list, parquet_dir: Path, workload: str, scenario: str, duration_s: float,
                      epoch_s: float) -> dict[str, dict]:
    """``{change id: {"config", "model_ratio", "magnitude"}}`` for the changes our configs explain (see module)."""
    from dynamiccl.harness.retuner_eval.truth import Truth
    from dynamiccl.harness.simulator.scenario import load as load_scenario
    from dynamiccl.harness.simulator.workload import load as load_workload

    w, sc = load_workload(workload), load_scenario(scenario)
    tr = Truth(w, sc, duration_s)
    out: dict[str, dict] = {}
    for c in changes:
        if c.kind == "recovery":
            if c.recovers in out:
                out[c.id] = {**out[c.recovers], "recovers": c.recovers, "magnitude": c.magnitude}
            continue
        why = _level_of_our_config(c, tr, w, sc, parquet_dir, epoch_s)
        if why is None and c.kind == "straggler":
            why = _probe_made_ranks_late(c, tr, w, sc, parquet_dir, epoch_s)
        if why is not None:
            out[c.id] = why
    return out


def _level_of_our_config(c, tr, w, sc, parquet_dir: Path, epoch_s: float) -> dict | None:
    """The change's own streams ran a config of ours whose modelled time against NCCL's default matches it."""
    from dynamiccl.harness.simulator.cost_model import ALGOS, PROTOS

    names = set(c.comm_names or ())
    t_on = c.start_s - epoch_s
    running = _configs_at(parquet_dir, names, int(c.start_s * 1e9), int((c.start_s + 1.0) * 1e9))
    state = sc.state_at(t_on, w.topology)
    ratios = []
    for op in tr.ops:
        cfg = running.get(op.comm.name)
        if cfg is None or math.frexp(op.nbytes)[1] - 1 not in (c.size_buckets or ()):
            continue
        default = tr.default_cfg(op)
        if cfg[:2] == default[:2] and cfg[2] == tr.decision(op, default)[2]:
            continue                   # NCCL's own choice: nothing of ours to explain it
        ratios.append((tr.time_us(op, cfg, state) / tr.time_us(op, default, state), cfg))
    if ratios and all(abs(r / c.magnitude - 1.0) <= TOLERANCE for r, _ in ratios):
        r, cfg = ratios[0]
        return {"config": f"{ALGOS[cfg[0]]}/{PROTOS[cfg[1]]}/{cfg[2]}", "model_ratio": r,
                "magnitude": c.magnitude}
    return None
