"""The family round after a regime change (``Retuner._family_round``): it probes cells the ranking vetoed, and is
skipped when a ranked candidate tied with the winner (the ranking found as good a config)."""
from __future__ import annotations

import pytest

from dynamiccl.retuner.agent import Retuner
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig
from dynamiccl.retuner.explore import Exploration
from dynamiccl.retuner.stats import Running
from dynamiccl.retuner.types import Candidate

from retuner_fakejob import FakeJob, simple_cost, target

INC = Candidate("TREE", "LL128", 0)            # the baseline's config, 1.64x slower than NCCL's choice in the regime
RANKED = Candidate("RING", "LL128", 16)        # the ranking's first candidate: NCCL's cell at an explicit count


def _after_round1(tmp_path, ranked_mean_s: float) -> tuple[Retuner, Exploration]:
    pol = PolicyConfig(tune_at_start=False, min_samples=4)
    rt = Retuner(RetunerConfig(dry_run=False, tuner_config_path=str(tmp_path / "tuner.conf"), audit_path=None,
                               policy=pol), clock=lambda: 0.0)
    job = FakeJob(str(tmp_path / "tuner.conf"), [target()], simple_cost({}))
    rt.observe(job.step())
    x = Exploration("x1", trigger="rc-1", kind="latency", members=[target()], incumbent=INC, policy=pol,
                    fingerprint=("latency", ("0x1f",), 2.0), t_start=0.0)
    x.default_cell = ("RING", "LL128")
    # the refit predicted NCCL's cell 2.1x slower than it measured: the model misjudged it
    x.model_ranked = [(("TREE", "LL128"), 1000.0), (("RING", "LL128"), 1280.0)]
    x.model_inc_pred_us = 1000.0
    x.stats[INC] = Running(n=64, mean=983e-6, m2=0.0)
    x.stats[None] = Running(n=64, mean=600.7e-6, m2=0.0)                   # NCCL's choice: the round's best
    x.stats[RANKED] = Running(n=96, mean=ranked_mean_s, m2=0.0)
    rt.explorations[x.id] = x
    rt.targets[target().key].exploration = x.id
    return rt, x


@pytest.mark.parametrize("ranked_mean_s,family_round", [(601.4e-6, False), (700e-6, True)])
def test_no_family_round_when_a_ranked_candidate_ties_with_nccls_choice(tmp_path, ranked_mean_s, family_round):
    """RING/LL128/16 ran within min_gain (1 %) of NCCL's own RING/LL128: the ranking found the best, so probing
    the vetoed families (TREE/LL ran 2.7x slower than the winner in the development case) only costs. 16 % slower,
    the ranking failed and the family round runs."""
    rt, x = _after_round1(tmp_path, ranked_mean_s)
    assert x.misjudged(1.5) is not None
    assert rt._family_round(x) is family_round
    assert (x.ranked_tie() == RANKED.name) is not family_round


def test_no_family_round_when_the_ranking_put_nccls_own_cell_first_and_it_won(tmp_path):
    """The refit ranked RING/LL128 at NCCL's channel count first (no separate probe of NCCL's choice was added) and
    it won round 1: the ranking worked although it misjudged that cell's time 2.1x."""
    rt, x = _after_round1(tmp_path, 700e-6)
    x.stats[Candidate("RING", "LL128", 0)] = x.stats.pop(None)             # ranked, not the unranked probe
    assert x.misjudged(1.5) is not None and x.is_default(x.best())
    assert rt._family_round(x) is False
