"""The held-out scenario families (heldout/families.yaml, fixed before training): paths for the evaluation."""
from __future__ import annotations

from pathlib import Path

import yaml

__all__ = ["HELDOUT_DIR", "HELDOUT_FILE", "heldout"]

HELDOUT_DIR = Path(__file__).resolve().parent / "heldout"
HELDOUT_FILE = HELDOUT_DIR / "families.yaml"


def heldout() -> dict:
    """{"topologies", "seeds", "workloads" (paths), "scenarios" (paths)} of the held-out families."""
    d = yaml.safe_load(HELDOUT_FILE.read_text(encoding="utf-8"))
    return {"topologies": tuple(d["held_out_topologies"]), "seeds": tuple(int(s) for s in d["held_out_seeds"]),
            "workloads": tuple(str(HELDOUT_DIR / w) for w in d["workloads"]),
            "scenarios": tuple(str(HELDOUT_DIR / s) for s in d["scenarios"])}
