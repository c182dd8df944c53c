"""The learned retuning policy (issue 21): an LSTM action-value policy trained in the simulator.

* :mod:`.actions` — the action grid: (algorithm, protocol) cell x channel choice x chunk choice (chunk size stands
  for the design's numThreads; the shipped grid keeps NCCL's chunk). Masked to the cells NCCL enabled.
* :mod:`.state` — the state vector and the history sequence the LSTM reads.
* :mod:`.reward` — r = −(time / baseline) − λ_switch·1[changed] − λ_probe·1[unmeasured] − λ_cong·congestion.
* :mod:`.policy` — numpy inference of the shipped weights (``policy.npz``); the agent's one hook asks it to rank
  round-1 candidates. The product never imports torch.
* :mod:`.train` (harness layer: it drives the simulator) — data, curriculum, torch training, the weights file.
"""
from dynamiccl.retuner.learned.policy import DEFAULT_WEIGHTS, LearnedPolicy

__all__ = ["LearnedPolicy", "DEFAULT_WEIGHTS"]
