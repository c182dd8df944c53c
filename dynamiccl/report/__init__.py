"""Offline analysis of a recorded run: ``dynamiccl report`` (one self-contained HTML file) and
``dynamiccl replay`` (re-run the detector, and the retuner in dry run, with other settings).

One small module per role:

- :mod:`dynamiccl.report.inventory` — which part files a run holds, their schema versions, what is wrong;
- :mod:`dynamiccl.report.summary` — polars lazy streaming scans reducing the records to small tables;
- :mod:`dynamiccl.report.sidecars` — ``changes.jsonl``, ``retuner-audit.jsonl``, ``truth.jsonl`` next to the run;
- :mod:`dynamiccl.report.tables` — the numbers shown; :mod:`dynamiccl.report.figures` — plotly figures;
  :mod:`report.html` — the page;
- :mod:`dynamiccl.report.replay` — the what-if replay (the one detector and the retuner, through :mod:`dynamiccl.loop`);
- :mod:`dynamiccl.harness.synthetic_run` — a seeded synthetic run written through the collector's exporter;
- :mod:`dynamiccl.report.cli` — the two subcommands.

See dynamiccl/report/README.md.
"""
