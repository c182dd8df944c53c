"""Find the GPUs and the plugins, and start one set of ranks (a "launch") of the kit's worker.

Several ranks share a GPU by each getting its own ``NCCL_HOSTID``: NCCL then sees one host per
rank and connects them with its socket transport over loopback. Only the standard library here;
torch is imported by :func:`probe_gpu` alone.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GpuInfo", "probe_gpu", "build_plugins", "Plan", "plan_ranks", "Launch", "run_launch"]

REPO_ROOT = Path(__file__).resolve().parents[2]


class KitError(RuntimeError):
    """The environment cannot run the kit; ``code`` is the exit status."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class GpuInfo:
    count: int
    names: list[str]
    torch_version: str
    nccl_version: str


def probe_gpu() -> GpuInfo:
    try:
        import torch
    except ImportError as e:   # not installed, or it cannot load (a preloaded NCCL lacking a symbol it needs)
        raise KitError(4, f"PyTorch cannot be imported (the kit needs torch built with NCCL): {e}") from None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise KitError(3, "no NVIDIA GPU visible to PyTorch (torch.cuda.is_available() is False): "
                          "nothing to validate on this machine")
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_nccl_available()):
        raise KitError(4, f"this PyTorch ({torch.__version__}) is built without NCCL")
    n = torch.cuda.device_count()
    v = torch.cuda.nccl.version()
    nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return GpuInfo(n, [torch.cuda.get_device_name(i) for i in range(n)], torch.__version__, nccl)


def build_plugins() -> dict[str, str]:
    """Paths of the profiler and tuner plugins; built with make + cc when missing."""
    from dynamiccl import nccl_profiler_plugin
    from dynamiccl import nccl_tuner_plugin
    out = {}
    for name, mod, target in (("profiler", nccl_profiler_plugin, "libnccl-profiler-dynamiccl.so"),
                              ("tuner", nccl_tuner_plugin, "libnccl-tuner-dynamiccl.so")):
        try:
            out[name] = str(mod.library_path())
            continue
        except FileNotFoundError:
            pass
        folder = Path(mod.__file__).parent
        if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
            raise KitError(4, f"the {name} plugin is not built and make/cc are missing to build it "
                              f"(make -C {folder} {target})")
        res = subprocess.run(["make", "-C", str(folder), target], capture_output=True, text=True)
        if res.returncode != 0:
            raise KitError(4, f"building the {name} plugin failed:\n{res.stderr[-2000:]}")
        out[name] = str(mod.library_path())
    return out


@dataclass
class Plan:
    ranks: int
    devices: list[int]
    shared: bool           # several ranks on one GPU through NCCL_HOSTID
    note: str = ""


def plan_ranks(requested: int, gpus: int, *, allow_shared: bool = True) -> Plan:
    """``requested`` ranks over ``gpus`` GPUs, round robin; shared when there are fewer GPUs.

    >>> plan_ranks(4, 1)
    Plan(ranks=4, devices=[0, 0, 0, 0], shared=True, note='4 ranks share 1 GPU(s) (one NCCL_HOSTID per rank)')
    >>> plan_ranks(4, 1, allow_shared=False).ranks
    1
    >>> plan_ranks(2, 8)
    Plan(ranks=2, devices=[0, 1], shared=False, note='')
    """
    if requested <= gpus:
        return Plan(requested, list(range(requested)), False)
    if allow_shared:
        return Plan(requested, [r % gpus for r in range(requested)], True,
                    f"{requested} ranks share {gpus} GPU(s) (one NCCL_HOSTID per rank)")
    return Plan(gpus, list(range(gpus)), False,
                f"sharing a GPU failed with this NCCL; fell back to one rank per GPU ({gpus})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Launch:
    name: str
    phases: list[str]
    plugins: bool
    debug: bool = False
    env: dict = field(default_factory=dict)    # set last, over the kit's own settings (extras.py)
    results: list[dict] = field(default_factory=list)
    returncodes: list[int | None] = field(default_factory=list)
    wall_s: float = 0.0
    timed_out: bool = False
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes) and bool(self.results)


def rank_env(plan: Plan, rank: int, port: int, spec_path: str, launch: Launch, paths: dict) -> dict:
    env = dict(os.environ)
    # the kit's own collector takes no token; the user's NCCL settings would change what is checked
    for k in ("NCCL_PROFILER_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE",
              "DYNAMICCL_TOKEN", "DYNAMICCL_TOKEN_FILE", "DYNAMICCL_TUNER_CHAIN", "DYNAMICCL_EVENT_MASK",
              "DYNAMICCL_PROFILER_CHAIN", "DYNAMICCL_CLOCK"):
        env.pop(k, None)
    env.update({"RANK": str(rank), "WORLD_SIZE": str(plan.ranks), "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DCCL_VALIDATE_SPEC": spec_path,
                "TORCH_NCCL_ENABLE_TIMING": "1", "PYTHONPATH": os.pathsep.join(
                    [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])})
    if plan.shared:
        env.update({"NCCL_HOSTID": f"dccl-validate-{rank}", "NCCL_SOCKET_IFNAME": "lo",
                    "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"})
    if launch.plugins:
        env.update({"NCCL_PROFILER_PLUGIN": paths["profiler"], "NCCL_TUNER_PLUGIN": paths["tuner"],
                    "DYNAMICCL_COLLECTOR": f"unix:{paths['socket']}",
                    "DYNAMICCL_TUNER_CONFIG": paths["tuner_config"], "DYNAMICCL_HOST": f"rank{rank}",
                    "DYNAMICCL_JOB_ID": f"validate-{launch.name}"})
    if launch.debug:
        env.update({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING,PROFILE",
                    "NCCL_DEBUG_FILE": os.path.join(paths["out"], f"nccl.{launch.name}.%p.log")})
    else:
        env["NCCL_DEBUG"] = "WARN"
    env.update({k: v.replace("{out}", paths["out"]) for k, v in launch.env.items()})
    return env


def _wait_all(procs: list, deadline: float, grace_s: float = 20.0) -> bool:
    """True when every process ended by ``deadline``; a rank that failed leaves the others (blocked
    in NCCL waiting for it) ``grace_s`` to end before they count as hung."""
    failed_at = None
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return True
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            return False
        time.sleep(0.1)
    return False


def run_launch(plan: Plan, launch: Launch, spec: dict, paths: dict, timeout_s: float) -> Launch:
    """Start ``plan.ranks`` workers, wait for all (killing every one at ``timeout_s``), read results."""
    spec = dict(spec, phases=launch.phases, launch=launch.name, devices=plan.devices, out=paths["out"])
    spec_path = os.path.join(paths["out"], f"spec.{launch.name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    port = free_port()
    logs = [open(os.path.join(paths["out"], f"worker.{launch.name}.rank{r}.log"), "w") for r in range(plan.ranks)]
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "dynamiccl.validate.worker"], cwd=str(REPO_ROOT),
                              env=rank_env(plan, r, port, spec_path, launch, paths),
                              stdout=logs[r], stderr=subprocess.STDOUT) for r in range(plan.ranks)]
    launch.timed_out = not _wait_all(procs, t0 + timeout_s)
    if launch.timed_out:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
    launch.wall_s = time.monotonic() - t0
    launch.returncodes = [p.returncode for p in procs]
    for f in logs:
        f.close()
    for r in range(plan.ranks):
        path = os.path.join(paths["out"], f"rank{r}.{launch.name}.json")
        if os.path.exists(path):
            with open(path) as f:
                launch.results.append(json.load(f))
    if not launch.ok:
        with open(os.path.join(paths["out"], f"worker.{launch.name}.rank0.log"), errors="replace") as f:
            launch.stderr_tail = f.read()[-3000:]
    return launch
