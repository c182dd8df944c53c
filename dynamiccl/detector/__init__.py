"""Change and anomaly detectors of the DynamICCL trigger agent.

Two contracts, both river's:

- **Drift detectors** (`river.base.DriftDetector`): ``update(x)`` returns None; read the
  ``drift_detected`` property afterwards. A detector resets itself on the update that follows
  an alarm. `CUSUM` is the scalar one; `CUSUMBank` runs thousands of independent CUSUMs with one
  numpy call per step (``update_many(x)``, ``drift_detected`` is then a boolean array).
- **Anomaly detectors** (`river.base.AnomalyDetector`): ``learn_one(x)`` and ``score_one(x) ->
  float`` over a dict of features; higher means more anomalous. `Autoencoder` also has
  ``learn_many``/``score_many`` for numpy arrays and polars frames. It needs torch, imported
  only when an `Autoencoder` is built (``pip install 'dynamiccl[autoencoder]'``).

`dynamiccl.detector.arl` holds the ARL / threshold / delay-bound formulas; `dynamiccl.detector.checks` the
conformance suite every detector in ``__all__`` must pass.

The service built on them: `dynamiccl.detector.service.Detector` (in process: ``process(window) ->
list[RegimeChange]``), `dynamiccl.detector.runner.DetectorService` and ``dynamiccl detector run|evaluate``
(see the package README).

"""

from __future__ import annotations

from .autoencoder import Autoencoder
from .cusum import CUSUM
from .cusum_bank import CUSUMBank

__all__ = ["Autoencoder", "CUSUM", "CUSUMBank"]
