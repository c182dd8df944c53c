"""Offline analysis of a recorded run: ``dynamiccl report`` (one self-contained HTML file) and
``dynamiccl replay`` (re-run the detector, and the retuner in dry run, with other settings).

One small module per role:

- :mod:`report.inventory` — which part files a run holds, their schema versions, what is wrong;
- :mod:`report.summary` — polars lazy streaming scans reducing the records to small tables;
- :mod:`report.sidecars` — ``changes.jsonl``, ``retuner-audit.jsonl``, ``truth.jsonl`` next to the run;
- :mod:`report.tables` — the numbers shown; :mod:`report.figures` — plotly figures;
  :mod:`report.html` — the page;
- :mod:`report.replay`, :mod:`report.detect` — the what-if replay and its detector;
- :mod:`report.synthetic` — a seeded synthetic run written through the collector's exporter;
- :mod:`report.cli` — the two subcommands.

See report/README.md.
"""
