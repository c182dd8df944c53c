"""Record sources that run inside a training process and stream the plugin's wire format.

- :mod:`dynamiccl.collector.sources.torch_distributed` — per-collective timings from ``torch.distributed``
  (any backend); ``import dynamiccl.collector.sources.torch_distributed as d; d.enable()``. Its parts:
  :mod:`~dynamiccl.collector.sources.torch_hooks` (what ``enable()`` installs into ``torch.distributed``)
  and :mod:`~dynamiccl.collector.sources.torch_recorder` (communicators, counters, async completions).
- :mod:`dynamiccl.collector.sources.wire_sender` — the bounded queue and background sender thread they
  share (PROCESS / COMM / COLL / P2P / STATS records over ``unix:`` or ``tcp:``).
"""
