"""Run `dynamiccl demo` as a user would (a subprocess) and check its summary.json against what the demo promises:
every true network event detected within 5 s (the benign pause not), no detected change that neither matches a
true change nor was audited by the retuner as caused by its own config, a kept config in the latency regime
with a measured gain, the revert after it, every rank on the same config and version, and (``--fast``) the job
paced without giving up on the pipeline. ``python tests/demo/demo_runs.py [--realtime] [--torch-only |
--no-torch-only] [--keep=DIR] SEED...`` prints the matrix (with and without torch; ``--keep`` keeps the runs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# torch absent, as after `pip install .` without the autoencoder extra: the path finder does not see it (every
# `import torch` fails and `find_spec("torch")` is None, as when it is not installed)
NO_TORCH = """
import sys
from importlib.machinery import PathFinder
class NoTorch(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            return None
        return PathFinder.find_spec(name, path, target)
sys.meta_path[:] = [NoTorch if f is PathFinder else f for f in sys.meta_path]
from dynamiccl.cli import main
sys.exit(main())
"""
MIN_GAIN = 1.2          # the oracle's gain on the regime's stream is 1.41x
#: real time: a window is handled ~lateness (2 s) after its end when the pipeline keeps up; beyond this it is behind
MAX_HANDLING_LAG_S = 4.0
#: the change kind the detector should report for each true event (dynamiccl.harness.retuner_eval.truth.KIND_OF)
WANT_KIND = {"bw_drop": "bandwidth", "latency": "latency", "straggler": "straggler"}


def run_demo(out: Path, seed: int, *, torch: bool, fast: bool = True, timeout: float = 600) -> dict:
    cmd = [sys.executable, "-m", "dynamiccl"] if torch else [sys.executable, "-c", NO_TORCH]
    cmd += ["demo", "--no-live", "--out", str(out), "--seed", str(seed), "--metrics", "127.0.0.1:0"]
    cmd += ["--fast"] if fast else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"demo exited {p.returncode}: {p.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def problems(s: dict) -> list[str]:
    out = []
    for e in s["events"]:
        if e["benign"] and e["detected_s"] is not None:
            out.append(f"benign {e['kind']} at {e['t_start']:.0f} s reported as a change")
        if not e["benign"] and e["detected_s"] is None:
            out.append(f"{e['kind']} at {e['t_start']:.0f} s not detected")
        elif e["kind"] in WANT_KIND and e["change_kind"] != WANT_KIND[e["kind"]]:
            out.append(f"{e['kind']} at {e['t_start']:.0f} s reported as {e['change_kind']}")
    out += [f"unmatched change: {u}" for u in s["unmatched"]]
    gains = s["retuner_gains"]
    if not gains:
        out.append("no regime where the oracle gains")
    for g in gains:
        if g["kept"] is None or (g.get("measured_gain") or 0) < MIN_GAIN:
            out.append(f"{g['kind']}: kept {g['kept']}, measured gain {g.get('measured_gain')}")
        if g["reverted_at_s"] is None or g["default_again_at_s"] is None:
            out.append(f"{g['kind']}: no revert to NCCL's default after {g['t_end']:.0f} s")
    c = s["consistency"]
    if c["inconsistent"] != 0 or c["instances"] == 0:
        out.append(f"ranks disagreed on {c['inconsistent']} of {c['instances']} collective instances")
    if s["run"]["fast"] and s["pacing"]["timeouts"]:
        out.append(f"pacing gave up {s['pacing']['timeouts']} times")
    # --fast: every version written before the job's last seconds reaches the job within the pacing lag + one
    # step (the pacer's promise; real time: whatever the pipeline's wall-clock delay is, reported, not a promise)
    limit = s["pacing"]["promise_s"] + 1e-3
    late = [(t, v, d) for t, v, d in s["push_to_records_s"]
            if t < s["run"]["sim_s"] - limit and (d is None or d > limit)]
    if late and s["run"]["fast"]:
        out.append(f"versions applied late or never (window s, version, delay s): {late}")
    lag = s["run"].get("handling_lag_s")
    if not s["run"]["fast"] and lag and lag["p90"] > MAX_HANDLING_LAG_S:
        out.append(f"the pipeline fell behind the job's clock: windows handled {lag['p50']:.1f} s (median), "
                   f"{lag['p90']:.1f} s (p90), {lag['max']:.1f} s (max) after their end at load "
                   f"{s['pacing'].get('load_average')}")
    if s["run"].get("dropped"):
        out.append(f"records dropped: {s['run']['dropped']}")
    return out


def row(s: dict) -> str:
    det = " ".join(f"{e['kind'].replace(' ', '-')}+{e['detected_s'] - e['t_start']:.0f}"
                   + (f"({e['change_kind']})" if e["kind"] in WANT_KIND else "") for e in s["events"]
                   if e["detected_s"] is not None)
    g = s["retuner_gains"][0] if s["retuner_gains"] else {}
    lags = [d for _t, _v, d in s["push_to_records_s"] if d is not None]
    return (f"fast={s['run']['fast']} torch={s['run']['autoencoder_available']} seed={s['run']['seed']} "
            f"wall={s['run']['wall_s']:.0f}s detected=[{det}] unmatched={len(s['unmatched'])} "
            f"own_config={len(s['own_config_changes'])} late_alarms={len(s['late_alarms'])} kept={g.get('kept')}@{g.get('kept_at_s')} "
            f"gain={g.get('measured_gain') or 0:.3f} oracle={g.get('oracle_gain') or 0:.3f} "
            f"captured={g.get('captured') or 0:.2f} reverted={g.get('reverted_at_s')} "
            f"inconsistent={s['consistency']['inconsistent']} paced_waits={s['pacing']['waits']} "
            f"timeouts={s['pacing']['timeouts']} longest_wait={s['pacing']['longest_wait_s']:.1f}s "
            f"promise={s['pacing']['promise_s']:.2f}s handling_lag={s['run'].get('handling_lag_s')} slowest_window={s['run'].get('slowest_window')} load={s['pacing']['load_average']} "
            f"push->records={min(lags, default=0):.2f}-{max(lags, default=0):.2f}s problems={problems(s)}")


if __name__ == "__main__":
    import tempfile

    args = sys.argv[1:]
    fast = "--realtime" not in args
    seeds = [int(a) for a in args if a.isdigit()] or [0, 1, 2]
    torches = [t for t in (True, False) if not (t and "--no-torch-only" in args) and not (not t and "--torch-only" in args)]
    keep = next((a.split("=", 1)[1] for a in args if a.startswith("--keep=")), None)
    for torch in torches:
        for seed in seeds:
            with tempfile.TemporaryDirectory() as d:
                out = Path(keep) / f"{'fast' if fast else 'rt'}-{'torch' if torch else 'notorch'}-s{seed}" if keep \
                    else Path(d) / "run"
                print(row(run_demo(out, seed, torch=torch, fast=fast)), flush=True)
    print(f"load average {os.getloadavg()}")
