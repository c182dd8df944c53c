"""Behaviour-identity check for refactors: cache seeded suite windows once (pickle), replay the
detector on them, dump changes + counters as JSON; diff two dumps (before/after a change).
  python tests/detector/replay_identity.py cache /tmp/win.pkl
  python tests/detector/replay_identity.py replay /tmp/win.pkl /tmp/after.json   # run from each tree
"""
import json
import pickle
import sys
import os
sys.path.insert(0, os.getcwd())
from dynamiccl.harness import detector_eval as E
from dynamiccl.detector.config import DetectorConfig
from dynamiccl.detector.service import Detector

def specs():
    s = E.build_suite(1, quick=True)
    s += E.build_suite(1, workloads=("eval-mixed",), kinds=("straggler","latency","flap"), stationary_hours={"x":0})
    s += E.build_suite(1, workloads=("llama7b-tp8-dp2",), kinds=("bw_drop","degrading_nic"), stationary_hours={"x":0})
    return s

def cache(path):
    from dynamiccl.harness.simulator import scenario as S
    from dynamiccl.harness.simfeed import SimFeed
    out = []
    for spec in specs():
        wl = E.load_workload(spec.workload)
        sc = S.from_dict({"name": spec.name, "noise_sigma": 0.05, "duration_s": spec.duration_s, "events": spec.events})
        feed = SimFeed(wl, sc, seed=spec.seed, duration_s=spec.duration_s, realism=E.realism(**spec.realism), job_id=spec.name)
        out.append((spec.name, list(feed.windows())))
        print(spec.name, len(out[-1][1]), flush=True)
    pickle.dump(out, open(path, "wb"))

def replay(path, outp):
    res = {}
    for name, wins in pickle.load(open(path, "rb")):
        det = Detector(DetectorConfig())
        ch = []
        for wf in wins:
            ch.extend(det.process(wf))
        res[name] = {"changes": [json.loads(c.to_json()) for c in ch], "counters": dict(det.fusion.counters)}
        print(name, len(ch), flush=True)
    json.dump(res, open(outp, "w"), indent=1, sort_keys=True)

if __name__ == "__main__":
    {"cache": lambda: cache(sys.argv[2]), "replay": lambda: replay(sys.argv[2], sys.argv[3])}[sys.argv[1]]()
