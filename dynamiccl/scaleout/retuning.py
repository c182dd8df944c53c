"""A retuner per job on the central tier (``dynamiccl central --retune``), with the single machine's
safety: the same :class:`~dynamiccl.retuner.agent.Retuner` behind the same
:class:`~dynamiccl.retuner.inputs.InputGate` as ``dynamiccl retuner run``.

* Dry run (recommend only, the audit log says what it would do) unless ``--apply``.
* Applying needs an allow-list of jobs (``--apply-job PATTERN``) and acts only on windows whose
  inputs all authenticated: every node's receiver required tokens (the partial's ``auth``) and the
  bus refused unknown publishers (the shard connects with ``--credentials``; scaleout/auth.py) —
  ``--allow-unauthenticated`` waives it, as on one machine.
* Each job writes its own tuner config and audit log: ``--tuner-config`` and ``--audit`` are path
  templates with ``{job}`` (job ids are subject tokens, ``[A-Za-z0-9_-]``, so they stay one path
  component). Every job's configuration is built and validated at start-up.

With ``--apply`` each version written is also published on the bus to the job's nodes
(``dynamiccl node --tuner-config``; scaleout/tuner_bus.py, scaleout/tuner_publish.py), which write it
where their ranks' tuner plugin reads it: no shared file system is needed.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["CentralRetuning", "JobRetuner", "RetunerFactory", "add_retuner_args", "retuning_from_args",
           "retuner_factory", "retuner_collector"]

DEFAULT_TUNER_CONFIG = "./runs/tuner-{job}.conf"
DEFAULT_AUDIT = "./runs/retuner-audit-{job}.jsonl"


def add_retuner_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("retuner (one per job; recommend only unless --apply)")
    g.add_argument("--retune", action="store_true", help="run a retuner per job (dry run: audit log only)")
    g.add_argument("--apply", action="store_true", help="write each job's tuner config (implies --retune; "
                                                        "needs --apply-job)")
    g.add_argument("--apply-job", action="append", default=None, metavar="PATTERN",
                   help="job id pattern the retuner may act on (repeatable; required with --apply)")
    g.add_argument("--comm", action="append", default=None, metavar="PATTERN",
                   help="communicator name or 0x-hash pattern (repeatable; default: all of an allowed job)")
    g.add_argument("--allow", action="append", default=None, metavar="ALGO/PROTO[/CH]", help="allow pattern")
    g.add_argument("--deny", action="append", default=None, metavar="ALGO/PROTO[/CH]", help="deny pattern")
    g.add_argument("--topology", default=None, help="simulator topology preset or YAML for NCCL's cost model")
    g.add_argument("--retuner-config", default=None, metavar="YAML", help="retuner config file (flags override it)")
    g.add_argument("--tuner-config", default=DEFAULT_TUNER_CONFIG, metavar="PATH",
                   help="each job's tuner config, with {job} (default %(default)s)")
    g.add_argument("--audit", default=DEFAULT_AUDIT, metavar="PATH",
                   help="each job's audit log, with {job}; 'off' (default %(default)s)")
    g.add_argument("--allow-unauthenticated", action="store_true",
                   help="with --apply, also act on windows whose nodes or bus did not authenticate their peers")


@dataclass(frozen=True)
class CentralRetuning:
    base: Any                        # RetunerConfig of every job, less its paths
    tuner_config: str                # template with {job}
    audit: str | None                # template with {job}; None: no audit log

    def for_job(self, job: str):
        return self.base.replace(tuner_config_path=self.tuner_config.format(job=job),
                                 audit_path=None if self.audit is None else self.audit.format(job=job)).validate()

    def validate(self, jobs: Iterable[str]) -> "CentralRetuning":
        jobs = sorted(jobs)
        if not self.base.dry_run and not self.base.jobs:
            raise ValueError("--apply needs an allow-list of jobs (--apply-job PATTERN, repeatable; docs/security.md)")
        for name, t in (("--tuner-config", self.tuner_config), ("--audit", self.audit)):
            if t is None:
                continue
            try:
                t.format(job="j")
            except (KeyError, IndexError, ValueError):
                raise ValueError(f"{name} {t!r}: only {{job}} may be substituted") from None
            if len(jobs) > 1 and "{job}" not in t:
                raise ValueError(f"{name} {t!r}: one file per job, put {{job}} in the path")
        for j in jobs:
            self.for_job(j)           # ValueError naming the field (e.g. the directory does not exist)
        return self


def retuning_from_args(args: argparse.Namespace, jobs: Iterable[str]) -> CentralRetuning | None:
    """The validated retuning of ``dynamiccl central``'s flags; None without ``--retune``/``--apply``."""
    if not (args.retune or args.apply):
        return None
    from dynamiccl.retuner.cli import config_from_args
    single = argparse.Namespace(config=args.retuner_config, apply=args.apply, topology=args.topology, changes="off",
                                features="off", metrics="off", tuner_config=None, audit=None, allow=args.allow,
                                deny=args.deny, job=args.apply_job, comm=args.comm,
                                allow_unauthenticated=args.allow_unauthenticated)
    audit = None if args.audit is None or args.audit.lower() in ("off", "none", "") else args.audit
    return CentralRetuning(config_from_args(single), args.tuner_config, audit).validate(jobs)


class JobRetuner:
    """One job's retuner behind the single-machine input gate (the loop's retuner)."""

    def __init__(self, retuner, gate):
        self.retuner, self.gate = retuner, gate

    def on_window(self, wf) -> int | None:
        wf = self.gate.window(wf)
        return None if wf is None else self.retuner.on_window(wf)

    def on_change(self, rc) -> int | None:
        return self.retuner.on_change(rc) if self.gate.change(rc.to_json()) else None

    def on_transient_end(self, te) -> int | None:
        """A transient's end (the loop's, never on the change stream), through the same gate as its recovery."""
        return self.on_change(te.as_recovery())

    def close(self) -> None:
        self.retuner.close()


def retuner_factory(retuning: CentralRetuning, retuners: dict[str, JobRetuner],
                    clock: Callable[[], float] | None = None,
                    seed: Callable[[str, str], bool] | None = None) -> "RetunerFactory":
    """``make_retuner`` for :func:`~dynamiccl.scaleout.central.detector_loop`: each job's retuner,
    kept in ``retuners`` (its counters for /metrics; closed by the caller). ``seed(job, path)``: puts
    the job's tuner file from the bus at ``path`` when the bus's is the job's (True if it did;
    scaleout/tuner_publish.py): a retuner then continues the job's version numbers, and one left
    behind them is rebuilt in place (``rebuild``: the loop holding it keeps its detector)."""
    return RetunerFactory(retuning, retuners, clock, seed)


class RetunerFactory:
    def __init__(self, retuning: CentralRetuning, retuners: dict[str, JobRetuner],
                 clock: Callable[[], float] | None, seed: Callable[[str, str], bool] | None):
        import time
        self.retuning, self.retuners, self.seed = retuning, retuners, seed
        self.clock = clock or time.time

    def _build(self, job: str):
        from dynamiccl.retuner.agent import Retuner
        from dynamiccl.retuner.inputs import InputGate
        cfg = self.retuning.for_job(job)
        rt = Retuner(cfg, clock=self.clock)
        gate = InputGate(jobs=cfg.jobs or ("*",), comms=cfg.comms,
                         allow_unauthenticated=cfg.allow_unauthenticated or cfg.dry_run, metrics=rt.metrics)
        return rt, gate

    def _seeded(self, job: str) -> bool:
        return self.seed is not None and self.seed(job, self.retuning.for_job(job).tuner_config_path)

    def __call__(self, job: str) -> JobRetuner:
        if self._seeded(job) and job in self.retuners:
            self.rebuild(job, seeded=True)   # another shard moved the job's versions on meanwhile
        if job not in self.retuners:  # a job moved away and back keeps its retuner (its versions, its memory)
            self.retuners[job] = JobRetuner(*self._build(job))
        return self.retuners[job]

    def rebuild(self, job: str, seeded: bool = False) -> None:
        """The job's retuner again from its (freshly seeded) tuner file, in place."""
        if not seeded:
            self._seeded(job)
        jr = self.retuners.get(job)
        if jr is not None:
            jr.retuner.close()
            jr.retuner, jr.gate = self._build(job)


def retuner_collector(retuners: Mapping[str, JobRetuner]):
    """A prometheus-client collector of every job's retuner: decisions, drops, pushes, version."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Retuners:
        def collect(self):
            ev = CounterMetricFamily("dynamiccl_central_retuner_events", "per job retuner counters",
                                     labels=["job", "what"])
            version = GaugeMetricFamily("dynamiccl_central_retuner_version", "tuner config version written",
                                        labels=["job", "dry_run"])
            for job, jr in sorted(retuners.items()):
                m = jr.retuner.metrics
                for k in ("changes", "windows", "pushes", "rollbacks"):
                    ev.add_metric([job, k], m.counters[k])
                for k, v in m.dropped.items():
                    ev.add_metric([job, f"dropped_{k}"], v)
                for k, v in m.decisions.items():
                    ev.add_metric([job, f"decision_{k}"], v)
                version.add_metric([job, str(int(m.dry_run))], m.version)
            yield ev
            yield version
    return _Retuners()
