"""``dynamiccl retuner train``: train the learned retuning policy in the simulator and write its weights file.

    dynamiccl retuner train [--out PATH] [--seed N] [--quick] [--chunk]

Default output: the shipped ``dynamiccl/retuner/learned/policy.npz``. ``--quick`` is a seconds-long run for tests.
"""
from __future__ import annotations

import argparse
import json
import os

__all__ = ["add_train_parser", "train_cmd"]


def add_train_parser(sub) -> None:
    t = sub.add_parser("train", help="train the learned retuning policy in the simulator (torch, CPU)")
    t.add_argument("--out", default=None, help="weights file (default: the shipped retuner/learned/policy.npz)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quick", action="store_true", help="tiny run (seconds) for tests")
    t.add_argument("--chunk", action="store_true", help="action grid with chunk choices (x1, x1/2, x1/4 of NCCL's)")
    t.add_argument("--json", metavar="PATH", help="also write the training report as JSON")
    t.set_defaults(func=train_cmd)


def train_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.retuner.learned.policy import DEFAULT_WEIGHTS
    from dynamiccl.retuner.learned.train import TrainConfig, train
    cfg = TrainConfig(seed=args.seed, chunk_choices=args.chunk)
    if args.quick:
        cfg = TrainConfig(seed=args.seed, samples=(20, 30, 30), epochs=(2, 2, 2), chunk_choices=args.chunk)
    try:
        rep = train(cfg, args.out or DEFAULT_WEIGHTS, log=lambda s: print(s, flush=True))
    except ValueError as e:
        print(f"dynamiccl retuner train: error: {e}")
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=1)
    out = args.out or DEFAULT_WEIGHTS
    print(f"weights={out} bytes={os.path.getsize(out)} train_s={rep['train_s']:.1f} "
          f"val_regret={rep['val_regret']:.4f} val_model_regret={rep['val_model_regret']:.4f} "
          f"val_samples={rep['val_samples']}")
    return 0
