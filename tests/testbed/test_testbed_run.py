"""The CI run of the test bed: ``dynamiccl testbed run --scenario ci`` end to end (slow, ~2.5 min).

4 gloo ranks in network namespaces streaming through the torch.distributed source to the
collector, the detector service live, 10 scripted link changes of >= 50 %. Checked: the run ends
with the machine-readable line, the ground truth and the detections are written, the stream was
lossless, nothing is left behind: any of these failing fails the test. The issue's detection
targets (every change detected within 3 s, no false alarm, single-rank throttles localised) are
checked last and asserted when the machine was quiet during the run — at most ``QUIET_STALLS``
of the quiet spans' windows (warm-up, 2-6.5 s after each release) more than 1.25x off their
median (`dynamiccl.harness.testbed.analyse.machine_noise`, measured from the run's own windows: 0-0.9 % on a quiet
machine) — and a miss on a busier machine is reported as an xfail carrying the score line and
the measured noise (unscripted 1.3-2x stalls of a shared machine are changes too; see
docs/testbed.md, "Measured"). Needs root + iproute2.
"""
from __future__ import annotations

import json
import re
import time

import pytest
from testbed_helpers import leftovers, require_testbed, start_run

QUIET_STALLS = 0.02   # measured: 0-0.9 % on a quiet machine (load < 1), 3-7 % at load 6-10, 18-35 % at 12-18
LINE = re.compile(r"^changes=(\d+) detected=(\d+) false_alarms=(\d+) max_delay_s=(\S+) localised=(\d+)/(\d+)$")


@pytest.mark.e2e
def test_ci_scenario_end_to_end(tmp_path):
    require_testbed()
    t0 = time.monotonic()
    proc = start_run(tmp_path / "state", tmp_path / "out", "--scenario", "ci")
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    m = LINE.match(last)
    assert m, last
    changes, detected, false_alarms = int(m[1]), int(m[2]), int(m[3])
    max_delay, localised, localisable = float(m[4]), int(m[5]), int(m[6])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    truth = json.loads((tmp_path / "out" / "truth.json").read_text())
    print(f"\n{last}  (wall {elapsed:.0f} s)")
    for row in summary["score"]["rows"]:
        print(f"  {row['description']:<40} {row.get('kind', 'MISSED'):<10} {row.get('delay_s', '-')}"
              f"  ranks={row.get('ranks', '-')}" + ("" if "localised" not in row else f"  localised={row['localised']}"))
    for fa in summary["score"]["false"]:
        print(f"  false alarm {fa['detection']['kind']} {fa['why']}")
    # the run itself
    assert elapsed < 180
    assert changes == len(truth["events"]) == 10
    assert summary["collector"]["records_decoded_total"] > 5000
    assert summary["collector"]["delivery_gap_records_total"] == 0
    # the short allowed lateness loses nothing: each rank's records arrive in start order
    assert not any(summary["collector_dropped"].values()), summary["collector_dropped"]
    for line in summary["workers"]:
        assert "dropped=0 undelivered=0" in line, line
    assert leftovers(summary["prefix"]) == []
    # the delay decomposition: every hit's stages happen in order and add up to its delay
    from dynamiccl.harness.testbed.analyse import decompose
    print("  delay decomposition (s after onset): first affected collective end / its window "
          "closed / detector's window end / emitted")
    for row in decompose(tmp_path / "out"):
        if row.get("delay_s") is None:
            continue
        print(f"  {row['description']:<40} {row.get('first_affected_end_s', '-')} / "
              f"{row.get('its_window_closed_s', '-')} / {row['detector_window_end_s']} / {row['delay_s']}")
        assert row["detector_window_closed_s"] <= row["delay_s"] + 1e-3
        if "its_window_closed_s" in row:
            assert row["first_affected_end_s"] <= row["its_window_closed_s"]
    assert localisable == 3 and detected >= 1
    # the targets
    missed = []
    if detected != changes:
        missed.append(f"recall {detected}/{changes}")
    if false_alarms:
        missed.append(f"{false_alarms} false alarm(s)")
    if not max_delay <= 3.0:
        missed.append(f"max delay {max_delay} s")
    if localised != localisable:
        missed.append(f"localised {localised}/{localisable}")
    from dynamiccl.harness.testbed.analyse import machine_noise
    noise = machine_noise(tmp_path / "out")
    print(f"  machine noise in the quiet spans: {noise}")
    if missed and noise["stall_share"] <= QUIET_STALLS:
        pytest.fail(f"detection targets not met on a quiet machine ({', '.join(missed)}; {noise}): {last}")
    if missed:
        pytest.xfail(f"detection targets not met on a busy machine ({', '.join(missed)}; {noise}): {last}")
