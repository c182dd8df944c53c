"""The kit's extra checks (record clock, per-peer timing, chained profiler) on a synthetic run:
a healthy one passes, each defect fails its own check and no other."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynamiccl.validate.analyse import analyse

from fake_extras import add_extras
from fake_run import fake_run

EXTRA = ("7 record clock (DYNAMICCL_CLOCK=1)", "8 per-peer timing (DYNAMICCL_EVENT_MASK=94)",
         "9 chained profiler (DYNAMICCL_PROFILER_CHAIN)")


def _checks(out: str) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(Path(out, "report.json").read_text())["checks"]}


def test_healthy_extras_pass(tmp_path):
    out = add_extras(fake_run(str(tmp_path / "run")))
    assert analyse(out)
    checks = _checks(out)
    assert all(checks[name]["status"] == "PASS" for name in EXTRA), {n: checks[n]["summary"] for n in EXTRA}
    assert checks["6a delivery"]["status"] == "PASS"      # PEER records count as delivered records


@pytest.mark.parametrize("breakage, check", [
    ("tsc_offset", EXTRA[0]), ("peer_bytes", EXTRA[1]), ("chain_count", EXTRA[2])])
def test_each_extra_defect_fails_its_check(tmp_path, breakage, check):
    out = add_extras(fake_run(str(tmp_path / "run")), breakage)
    assert not analyse(out)
    st = {k: v["status"] for k, v in _checks(out).items()}
    assert st[check] == "FAIL", st
    assert all(v == "PASS" for k, v in st.items() if k not in (check, "6b detection")), st


def test_host_without_invariant_tsc_skips_the_clock_check(tmp_path):
    out = add_extras(fake_run(str(tmp_path / "run")), "tsc_refused")
    analyse(out)
    checks = _checks(out)
    assert checks[EXTRA[0]]["status"] == "SKIP" and "invariant TSC" in checks[EXTRA[0]]["summary"]


def test_the_reference_launch_reads_clock_gettime():
    """Check 7 compares the TSC record clock with the reference launch's; the TSC is the default
    where the host qualifies, so the reference must force ``clock_gettime``."""
    from dynamiccl.validate.extras import extra_launches

    launches = {ln.name: ln for ln in extra_launches()[0]}
    assert launches["probe_ref"].env["DYNAMICCL_CLOCK"] == "0"
    assert launches["probe_tsc"].env["DYNAMICCL_CLOCK"] == "1"
